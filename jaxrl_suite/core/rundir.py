"""A run's output directory: whether it holds an earlier run, moving one aside, and which config
changes a resume may make. Shared by `jaxrl-suite run` (cli.py) and the Python API (api.py).

No run deletes data: a fresh run refuses a directory that holds an earlier run's work, and
`--overwrite` renames that work to a timestamped sibling (`move_aside`).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

from jaxrl_suite.core.config import (
    ConfigError,
    MovedKeyWarning,
    config_changes,
    from_dict,
    to_dict,
)

# Fields that may differ from the stored config.json on a resume: where and how often to save,
# how the devices are laid out, and logging; none of them changes what the run computes.
RESUME_MAY_CHANGE = ("run.checkpoint_every", "run.keep_checkpoints", "run.num_devices",
                     "run.mesh.", "run.wandb.")

RESUMES_FILE = "resumes.jsonl"  # one record per resume that changed an allowed field


def earlier_run(out_dir: Path) -> bool:
    """Whether `out_dir` holds work of an earlier run: a summary.json, a finished run's
    result.json, a logged metrics record or a checkpoint step. (A run that stopped at a bad
    config before any of these left only its config.json, and is simply started again.)"""
    if not out_dir.is_dir():
        return False
    if (out_dir / "summary.json").exists() or any(out_dir.glob("runs/**/result.json")):
        return True
    if any(p.stat().st_size for p in out_dir.rglob("metrics.jsonl")):
        return True
    ckpts = out_dir / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() and p.name.isdigit() for p in ckpts.rglob("*"))


def move_aside(out_dir: Path) -> Path:
    """Rename `out_dir` to a free timestamped sibling, OUT.old-YYYYmmdd-HHMMSS[-N]; returns it."""
    stem = f"{out_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"
    dest, n = out_dir.with_name(stem), 1
    while dest.exists():
        dest, n = out_dir.with_name(f"{stem}-{n}"), n + 1
    out_dir.rename(dest)
    return dest


def resume_changes(out_dir: Path, record: dict, *, what: str = "--resume",
                   hint: str = "resume with the run's config, or start afresh with --overwrite",
                   config_cls: type | None = None) -> dict[str, tuple]:
    """The fields of `record` (a run's config.json contents) that differ from the one stored in
    `out_dir`, as {"section.field": (old, new)}; all must be in RESUME_MAY_CHANGE, else one-line
    `ConfigError` (prefixed `what`, ending with `hint`) names the first few. {} without a
    stored config. With `config_cls` (the class of record["config"]), the stored config is
    compared as that class reads it today (`_stored_config`): a key that has moved since
    (`MOVED`) is no change."""
    stored = out_dir / "config.json"
    if not stored.is_file():
        return {}
    try:
        old = json.loads(stored.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {stored} does not read ({e})") from None
    if config_cls is not None:
        old = {**old, "config": _stored_config(config_cls, old.get("config"))}
    changes = {k.removeprefix("config."): v for k, v in config_changes(old, record).items()}
    refused = {k: v for k, v in changes.items() if not k.startswith(RESUME_MAY_CHANGE)}
    if refused:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(refused.items())[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        raise ConfigError(f"{what}: the config differs from {stored} in {shown}{more}; {hint}")
    return changes


def _stored_config(config_cls: type, stored):
    """A stored config.json's "config" as `config_cls` reads it today (`to_dict(from_dict(...))`:
    moved keys at their new places), or as stored if it no longer loads (the comparison then
    names what differs)."""
    if not isinstance(stored, dict):
        return stored
    try:
        with warnings.catch_warnings():  # the stored run's moved keys are not the user's to fix
            warnings.simplefilter("ignore", MovedKeyWarning)
            return to_dict(from_dict(config_cls, stored))
    except ConfigError:
        return stored


def log_resume_changes(out_dir: Path, changed: dict[str, tuple]) -> None:
    """Record the allowed changes of a resume in OUT/resumes.jsonl, and say them in one line."""
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "changed": {k: {"from": a, "to": b} for k, (a, b) in changed.items()}}
    with open(out_dir / RESUMES_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")
    print("jaxrl-suite: resuming with " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in
                                                    changed.items()) + f" ({RESUMES_FILE})",
          file=sys.stderr)
