"""bwd7's GPU window driver (temporary): one evaluator, expert_dev.check per (task, variants, workloads) in the
order given on the command line, e.g. `python3 try_bwd7/win.py mha_bwd_d128:shipped,v5:S77,S4096 ...`;
a trailing `+` on the task (mha_bwd_d128+) adds the executed-instruction credit."""
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
dev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dev)
from tools.evaluator import Evaluator  # noqa: E402

t0 = time.time()
with Evaluator() as ev:
    for job in sys.argv[1:]:
        task, names, only = job.split(":")
        executed = task.endswith("+")
        task = task.rstrip("+")
        try:
            dev.check(task, names.split(","), "all", only.split(",") if only != "all" else None, ev=ev, executed=executed)
        except Exception as e:  # keep going: the next job may still run
            print(f"{task} {names} EXC {type(e).__name__}: {e}", flush=True)
        print(f"-- {job} done at {time.time() - t0:.1f}s", flush=True)
