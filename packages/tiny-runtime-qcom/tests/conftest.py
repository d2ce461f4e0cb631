"""The helper modules next to these tests import by name: pytest's importlib mode doesn't put this folder on
sys.path, so it is added here once."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
