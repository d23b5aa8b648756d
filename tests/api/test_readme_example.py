"""The README's Python example runs as written, at a smoke size: the test takes the code block
under `<!-- python-api-example -->`, shrinks the data, the model and the step counts by exact
text replacements (each must apply, so an edited example fails here until this test follows it)
and runs it."""

import ast
import contextlib
import io
import re
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- python-api-example -->"
SMOKE = {
    "range(2000)": "range(16)",
    "range(200)": "range(4)",
    "LM.small()": "LM.small(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)",
    '"steps": 1200, "schedule_steps": 1200, "batch_size": 64':
        '"steps": 3, "schedule_steps": 3, "batch_size": 8',
    '"group_size": 8, "steps": 100': '"group_size": 2, "steps": 2, "prompts_per_step": 2',
}


def readme_example() -> str:
    text = README.read_text()
    assert MARKER in text, f"{README} has no {MARKER}"
    block = re.search(r"```python\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block, f"no python block after {MARKER}"
    return block.group(1)


def test_the_readme_python_example_runs_at_smoke_size(tmp_path, monkeypatch):
    code = readme_example()
    for old, new in SMOKE.items():
        assert code.count(old) == 1, f"the README example no longer holds {old!r} once"
        code = code.replace(old, new)
    ast.parse(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the trainers' default out_dirs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    lines = [line for line in out.getvalue().splitlines() if line.startswith(("SFT:", "GRPO:"))]
    assert [line.split(":")[0] for line in lines] == ["SFT", "GRPO"]
    for line in lines:
        result = ast.literal_eval(line.split(":", 1)[1].strip())
        assert result["examples"] == 4 and 0.0 <= result["greedy_accuracy"] <= 1.0
        assert set(result) >= {"greedy_accuracy", "sampled_accuracy", "mean_reward"}
    runs = sorted(p.name.split("_")[2] for p in tmp_path.glob("jaxrl_suite_*"))
    assert runs == ["grpo", "sft"]  # each trainer wrote its run under the default out_dir
