"""tensordict imported without torch._dynamo, its Dynamo marks applied once Dynamo loads.

Each case runs in a fresh interpreter: what is imported is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Prints, as JSON, the marks tensordict made: (function name, qualname of what it marked).
RECORD_REAL_MARKS = """
import json, torch, torch.compiler
made = []
def spy(name):
    real = getattr(torch.compiler, name)
    def call(fn):
        made.append((name, getattr(fn, "__qualname__", repr(fn))))
        return real(fn)
    return call
for name in ("allow_in_graph", "assume_constant_result"):
    setattr(torch.compiler, name, spy(name))
import tensordict.nn
print("MARKS " + json.dumps(made))
"""


def run(code: str, **env: str) -> str:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environ = {**os.environ, **env, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=environ, cwd=ROOT, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def line(stdout: str, tag: str) -> object:
    found = next(x for x in stdout.splitlines() if x.startswith(tag + " "))
    return json.loads(found[len(tag) + 1:])


def test_import_asyncrl_loads_tensordict_but_neither_dynamo_nor_sympy() -> None:
    out = run("""
        import json, sys
        import asyncrl
        from tensordict.nn import TensorDictModule
        print("LOADED " + json.dumps([m in sys.modules for m in
                                       ("tensordict", "torch._dynamo", "sympy")]))
    """)
    assert line(out, "LOADED") == [True, False, False]


def test_the_deferred_marks_are_tensordicts_own_and_all_applied_when_dynamo_loads() -> None:
    real = line(run(RECORD_REAL_MARKS, ASYNCRL_DEFER_DYNAMO="0"), "MARKS")
    out = run("""
        import json
        import transports._lazy_dynamo as lazy
        pending = lazy.pending_marks()
        names = [(n, getattr(f, "__qualname__", repr(f))) for n, f in pending]
        print("PENDING " + json.dumps(names))
        import torch._dynamo
        from torch._dynamo import trace_rules
        from torch._dynamo.variables import TorchInGraphFunctionVariable
        applied = []
        for name, fn in pending:
            if name == "assume_constant_result":
                applied.append(getattr(fn, "_dynamo_marked_constant", False))
            else:  # torch's own in-graph functions need no entry (allow_in_graph skips them)
                applied.append(id(fn) in trace_rules._allowed_callable_ids
                               or trace_rules.lookup_callable(fn) == TorchInGraphFunctionVariable)
        print("APPLIED " + json.dumps(applied))
        print("LEFT " + json.dumps(len(lazy.pending_marks())))
    """)
    assert real, "tensordict made no Dynamo mark at import: this module has nothing to defer"
    assert line(out, "PENDING") == real
    assert line(out, "APPLIED") == [True] * len(real)
    assert line(out, "LEFT") == 0


def test_torch_compile_after_import_asyncrl_traces_tensordict_code() -> None:
    out = run("""
        import json
        import asyncrl
        import torch
        from tensordict import TensorDict
        from tensordict.nn import TensorDictModule

        module = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
        td = TensorDict({"x": torch.arange(12.0).reshape(4, 3)}, batch_size=[4])
        eager = module(td.clone())["y"]
        compiled = torch.compile(module, backend="eager")(td.clone())["y"]
        batched = torch.vmap(lambda t: t["x"] * 2)(td)
        print("SAME " + json.dumps([torch.equal(eager, compiled),
                                    torch.equal(batched, td["x"] * 2)]))
    """)
    assert line(out, "SAME") == [True, True]


@pytest.mark.parametrize("first", ["tensordict", "torch._dynamo"])
def test_nothing_is_deferred_when_tensordict_or_dynamo_came_first(first: str) -> None:
    out = run(f"""
        import json
        import {first}
        import transports._lazy_dynamo as lazy
        print("PENDING " + json.dumps(len(lazy.pending_marks())))
    """)
    assert line(out, "PENDING") == 0


def test_asyncrl_defer_dynamo_0_imports_tensordict_the_usual_way() -> None:
    out = run("""
        import json, sys
        import asyncrl
        print("LOADED " + json.dumps("torch._dynamo" in sys.modules))
    """, ASYNCRL_DEFER_DYNAMO="0")
    assert line(out, "LOADED") is True
