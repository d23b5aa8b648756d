"""Two processes (2 CPU devices each) joined by `jax.distributed` train exactly like one process
with 4 devices (on an FSDP mesh, data 2 x fsdp 2: two SFT steps, a rollout and a GRPO update with
the parameters sharded across the processes), and the experiment runs end to end under
`jax.distributed` (SFT and GRPO steps, each process sampling and scoring its own rows) with
process 0 writing.
Both exit with status 0; and when either one fails, the other aborts with a clear message within
the heartbeat timeout instead of hanging in its next collective.

Each process only builds, samples and scores its own rows of every batch (`process_rows`); this is
the multi-host code path, run on one machine with CPU collectives (gloo) over loopback.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

STEPS = textwrap.dedent(
    """
    import jax, numpy as np
    from jaxrl_suite.algorithms.grpo import GRPOTrainer
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer
    from jaxrl_suite.core.parallel import make_mesh
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tokenizer import load_tokenizer
    from jaxrl_suite.models import CausalLM, LMConfig

    def train_fsdp():
        # mesh (data 2, fsdp 2, tensor 1): each process holds half of every matrix; two SFT
        # steps and a GRPO update on fixed advantages (signal, not Adam-normalised noise)
        model = CausalLM(LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64))
        params = model.init(jax.random.PRNGKey(0), np.zeros((1, 12), np.int32))
        tok, task = load_tokenizer(), make_task("arithmetic", digits=2)
        mesh = make_mesh(data=2, fsdp=2)
        sft = SFTTrainer(model, tok, task, SFTConfig(batch_size=8, warmup_steps=1), mesh=mesh,
                         prompt_len=12, max_new_tokens=22)
        s = sft.init_state(params, jax.random.PRNGKey(1))
        for i in range(2):
            s, _ = sft.step(s, sft.batch(i))
        grpo = GRPOTrainer(model, tok, task, GRPOConfig(prompts_per_step=4, group_size=4,
                           max_new_tokens=22, beta=0.05), mesh=mesh, prompt_len=12,
                           ref_params=params)
        g = grpo.init_state(s.params, jax.random.PRNGKey(2))
        seq, old_logp, rewards, info = grpo.rollout(g, grpo.batch(0))
        adv = np.random.default_rng(0).normal(size=16).astype(np.float32)
        g, m = grpo.update(g, seq, old_logp, rewards, info, advantages=adv)
        q = g.params["params"]["layer_0"]["attn"]["q"]["kernel"]
        assert q.sharding.spec[0] == "fsdp" and q.addressable_data(0).shape == (16, 32)
        return [np.asarray(x.addressable_data(0)) for x in jax.tree.leaves(g.params)], m
    """
)

WORKER = STEPS + textwrap.dedent(
    """
    import sys
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    assert jax.process_count() == 2 and jax.device_count() == 4
    fsdp, mf = train_fsdp()
    if pid == 0:
        np.savez(f"{out}/multi_fsdp.npz", *fsdp, loss=mf["loss"], kl=mf["kl"])
    from jaxrl_suite.cli import main
    sys.exit(main(["run", "grpo_arithmetic", "--smoke", "--no-progress", "--out", f"{out}/run"]))
    """
)

REFERENCE = STEPS + textwrap.dedent(
    """
    import sys
    assert jax.process_count() == 1 and jax.device_count() == 4
    fsdp, mf = train_fsdp()
    np.savez(f"{sys.argv[1]}/single_fsdp.npz", *fsdp, loss=mf["loss"], kl=mf["kl"])
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process_and_run_the_experiment(tmp_path):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(pid), str(port), str(tmp_path)],
            env=dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=2"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for pid in (0, 1)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    ref = subprocess.run(
        [sys.executable, "-c", REFERENCE, str(tmp_path)],
        env=dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=4"),
        capture_output=True, text=True, timeout=600,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]

    # data 2 x fsdp 2 across the two processes; the experiment below runs GRPO steps with
    # sampling and rewards split over them
    multi, single = np.load(tmp_path / "multi_fsdp.npz"), np.load(tmp_path / "single_fsdp.npz")
    assert sorted(multi.files) == sorted(single.files)
    for name in multi.files:
        np.testing.assert_allclose(multi[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)

    # The experiment under jax.distributed: process 0 alone wrote the outputs, once per step.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["devices"] == 4
    lines = (tmp_path / "run" / "runs" / "grpo_s0" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(x)["step"] for x in lines if json.loads(x)["stage"] != "final"]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == 5  # 3 SFT + 2 GRPO
    assert "held-out greedy after GRPO" in outputs[0]
    assert "held-out greedy" not in outputs[1]


# `jaxrl-suite run crash_probe --distributed`: a registered test experiment whose processes run a
# cheap cross-process collective (a sum over a global array) in a loop; process FAIL fails at its
# second step, by an exception (the CLI's handler exits at once) or by SIGKILL (a hard crash).
PROBE = textwrap.dedent(
    """
    import dataclasses, os, pathlib, signal, sys, time
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxrl_suite.cli import main
    from jaxrl_suite.core.experiment import EXPERIMENTS, Experiment

    @dataclasses.dataclass
    class ProbeConfig:
        fail: int = 1
        how: str = "raise"

    def run(cfg, opts):
        mesh = Mesh(np.asarray(jax.devices()), ("data",))
        total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P()))
        for step in range(3000):  # 5 min: far past the test's timeout
            x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")),
                                                       np.ones(2, np.float32))
            assert float(total(x)) == 4.0
            if step == 0:
                print(f"process {jax.process_index()}: joined", flush=True)
            if step == 1 and jax.process_index() == cfg.fail:
                if cfg.how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("simulated failure")
            time.sleep(0.1)
        return {}

    fail, how, out = sys.argv[1:]
    config = os.path.join(out, "crash_probe.yaml")  # an experiment ships its default config
    os.makedirs(out, exist_ok=True)
    with open(config, "w") as f:
        f.write("fail: 1")
    EXPERIMENTS.register("crash_probe", Experiment("crash_probe", ProbeConfig, run,
                                                   config=pathlib.Path(config)))
    sys.exit(main(["run", "crash_probe", "--distributed", "--no-progress", "--out", out,
                   "--set", f"fail={fail}", "--set", f"how={how}"]))
    """
)
HEARTBEAT_S = 10  # JAXRL_HEARTBEAT_TIMEOUT_S for the test (default 30)
FATAL = "JAX distributed service detected fatal errors"  # XLA's line before it aborts a process


@pytest.mark.parametrize(("failing", "how"), [(1, "raise"), (0, "raise"), (1, "kill"),
                                              (0, "kill")])
def test_a_failed_process_makes_the_other_abort_not_hang(tmp_path, failing, how):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}", JAX_NUM_PROCESSES="2",
               JAXRL_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_S))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE, str(failing), how, str(tmp_path / "run")],
            env=dict(env, JAX_PROCESS_ID=str(pid)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for pid in (0, 1)
    ]
    survivor = procs[1 - failing]

    def wait(proc, timeout, what):
        try:
            return proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{what} within {timeout} s:\n{proc.communicate()[0][-3000:]}")

    try:
        failed_out = wait(procs[failing], 120, f"process {failing} did not exit after failing")
        t_failed = time.monotonic()
        out = wait(survivor, HEARTBEAT_S + 50,
                   f"process {1 - failing} hung instead of aborting after process {failing} died")
        detected_s = time.monotonic() - t_failed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert "joined" in failed_out and "joined" in out, failed_out[-3000:] + out[-3000:]
    if how == "raise":  # the failing process reports, then exits at once (no shutdown barrier)
        assert procs[failing].returncode == 1, failed_out[-3000:]
        assert "RuntimeError: simulated failure" in failed_out
        assert f"jaxrl-suite: process {failing} of 2 failed" in failed_out
    else:
        assert procs[failing].returncode == -9
    assert survivor.returncode != 0, out[-3000:]
    if failing == 1:  # the coordinator (process 0) notices the missing heartbeats
        assert FATAL in out and "stopped sending heartbeats" in out, out[-3000:]
        assert detected_s < HEARTBEAT_S + 30
    else:  # the coordination service went down with process 0: the worker aborts at once (or
        # its collective fails first and the CLI exits)
        assert FATAL in out or "jaxrl-suite: process 1 of 2 failed" in out, out[-3000:]
        assert detected_s < 20
    print(f"process {failing} {how}: process {1 - failing} exited with {survivor.returncode} "
          f"{detected_s:.1f} s later")


def test_bad_distributed_settings_are_one_line_errors(monkeypatch, capsys):
    from jaxrl_suite.cli import main

    monkeypatch.setenv("JAXRL_HEARTBEAT_TIMEOUT_S", "soon")  # fails before joining any job
    assert main(["run", "grpo_arithmetic", "--smoke", "--distributed"]) == 2
    err = capsys.readouterr().err
    assert err == "jaxrl-suite: error: JAXRL_HEARTBEAT_TIMEOUT_S='soon' is not an integer\n"
