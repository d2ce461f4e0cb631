"""The model, ONNX and LLM tests (CPU only, their own nox session: `nox -s "tests(package='tiny-tensor:models')"`).
Their helper modules (llm_ref, onnx_conformance, torch_ref) import by name from this folder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
