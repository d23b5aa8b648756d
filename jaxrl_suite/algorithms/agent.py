"""Multi-turn tool-use RL: episodes that alternate model turns and tool turns, trained by GRPO.

An episode of a `ToolTask` (envs/text/tools) is one token sequence after the task's prompt:

    prompt | turn 1 <eos> | <result>tool output</result> | turn 2 <eos> | ... | <answer>.. <eos>

Each model turn is sampled by the rollout `Sampler` (the kit's protocol) on the whole context so
far, left-padded to prompt_len + agent.episode_tokens, up to grpo.max_new_tokens tokens; it
ends at EOS. A turn that calls a tool (`<tool>{"name":..,"args":{..}}</tool>`, parsed by
`parse_turn`, never eval'd) gets the tool's output as an observation; an <answer> turn ends the
episode, which `Task.verify_batch` scores; a malformed turn gets an "error: ..." observation and
is counted (format failures), never raised. After agent.max_turns model turns, or when the
sequence is full, the episode ends with whatever its last turn said.

Training is GRPO over whole episodes (`AgentTrainer`): G episodes per task, the episode's score
as the reward, `GRPOTrainer.update` on the trajectory as its completion. The tool-output tokens
are attended to but carry no loss: `SeqBatch.loss_mask` is 1 on the policy's tokens only, so
their policy-gradient and KL terms (and SFT terms, `EpisodeSFT`) are exactly zero. Each
policy token's behaviour log-prob and parameter version are recorded when it is sampled.

Off-policy rollouts with a staleness bound (agent.max_staleness = s > 0): a background thread
generates the rollouts of steps k+1..k+s with the newest parameters it has while the trainer
updates on step k, so a token may come from parameters up to s updates old. The update then
uses the current parameters' log-probs as the old policy of the ratio and weights each stale
token's pg term by the truncated importance weight min(exp(logp_old - logp_behaviour), C)
(`GRPOTrainer.update(behaviour_logp=...)`, grpo.tis_cap); tokens of the current version keep
their recorded log-probs, so a rollout with no stale token is the on-policy update exactly, and
s = 0 equals the synchronous run.

The dispatchers that run episodes (init -> LM steps -> tools -> reward) are in
algorithms/dispatch.py; tools and rewards run in a `ToolExecutor` (a process pool by default,
Ray at scale).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_suite.algorithms.dispatch import DISPATCH
from jaxrl_suite.algorithms.dynamic_sampling import draw_until_full, pool_metrics
from jaxrl_suite.algorithms.executors import make_executor
from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.sft import SFTTrainer
from jaxrl_suite.core.config import Count, NonNegativeInt, check_fields
from jaxrl_suite.core.parallel import host_local, shard_batch
from jaxrl_suite.core.train import TrainState
from jaxrl_suite.envs.text.base import Example
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.envs.text.tools.base import (
    ToolOutput,
    ToolTask,
    Turn,
    run_tool,
)
from jaxrl_suite.models.sequence import SeqBatch
from jaxrl_suite.sampling.base import Sampler

DISPATCHERS = ("batch", "pipeline")
EXECUTORS = ("process", "thread", "ray")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    max_turns: Count = 4  # model turns per episode (the last must answer)
    episode_tokens: Count = 256  # N: tokens of the whole trajectory after the prompt
    obs_chars: Count = 160  # a tool's output is cut to this many characters
    tools: bool = True  # False: the no-tools baseline (any tool call is an error observation)
    dispatcher: str = "pipeline"  # "batch" (async_batch) | "pipeline" (async_pipeline)
    concurrency: NonNegativeInt = 0  # episodes in flight at once (0 = the whole rollout)
    # most rows of one LM call (0 = concurrency); padded to powers of two
    lm_batch: NonNegativeInt = 0
    min_lm_batch: Count = 8  # the smallest padded LM call (fewer shapes, fewer compiles)
    executor: str = "process"  # tools and rewards: "process" | "thread" | "ray"
    workers: Count = 2  # workers of each executor (tools, rewards)
    # off-policy: rollouts may use parameters this many updates old (0 = on-policy)
    max_staleness: NonNegativeInt = 0
    # Generate in the background thread even at max_staleness = 0 (each rollout then waits for
    # the update before it: the synchronous schedule, through the asynchronous machinery).
    background: bool = False

    def __post_init__(self):
        check_fields(self, "agent.")  # the Ranges declared above
        if self.dispatcher not in DISPATCHERS:
            raise ValueError(f"agent.dispatcher must be one of {DISPATCHERS}, got "
                             f"{self.dispatcher!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"agent.executor must be one of {EXECUTORS}, got {self.executor!r}")


@dataclasses.dataclass(eq=False)
class Episode:
    """One trajectory being run (host-side state; the dispatchers move it between stages).

    `pending` is the next stage: "init" -> "lm" -> ("tool" -> "lm")* -> "reward" -> "done".
    tokens / logprobs / policy / versions are per trajectory token after the prompt: the token
    id, its behaviour log-prob (0 on tool output), whether the policy wrote it, and the version
    of the parameters that wrote it (-1 on tool output)."""

    uid: int  # global episode id: turn t is sampled as sequence uid * max_turns + t
    example: Example
    prompt_ids: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    policy: list[bool] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    context: Any = None  # the task's tool context (from the init stage)
    pending: str = "init"
    call: Turn | None = None  # the tool call waiting for the tool stage
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    format_errors: int = 0
    truncated: bool = False
    final: str = ""  # the text the task scores: the answer turn, else the last model turn
    score: float = 0.0
    outcome: str | None = None
    # An episode-level reward (`AgentTrainer(episode_reward=...)`) that replaces `score` as
    # the training reward, and its named parts (logged as reward_<name>).
    reward: float | None = None
    components: dict[str, float] = dataclasses.field(default_factory=dict)


def init_episode(task: ToolTask, example: Example) -> Any:
    """The init stage's job: the problem's tool context (picklable; runs in an executor)."""
    return task.tool_context(example)


def score_episode(task: ToolTask, final: str, example: Example) -> tuple[float, str | None]:
    """The reward stage's job: (score, outcome label) of the final turn by the task's verifier;
    a verifier that raises scores 0.0 with outcome "verifier_error" (never crashes a run)."""
    try:
        verdicts = task.verify_batch([final], [example])
    except Exception as e:  # noqa: BLE001 - a verifier bug is counted, not raised
        return 0.0, f"verifier_error:{type(e).__name__}"
    outcome = verdicts.outcomes[0] if verdicts.outcomes else None
    return float(verdicts.scores[0]), outcome


def episode_segments(ep: Episode, tokenizer: Tokenizer) -> list[tuple[bool, str]]:
    """An episode's text in order as (written by the policy?, text) segments: the prompt
    (False), then each model turn (True; a turn ends at its EOS) and each observation (False).
    Episode-level rewards read them, e.g. the s3 searcher's selected documents."""
    out: list[tuple[bool, str]] = [(False, ep.example.prompt)]
    run: list[int] = []
    for i, (tok, mine) in enumerate(zip(ep.tokens, ep.policy, strict=True)):
        run.append(tok)
        nxt = ep.policy[i + 1] if i + 1 < len(ep.tokens) else None
        if nxt != mine or (mine and tok == tokenizer.eos_id):
            out.append((mine, tokenizer.decode(run)))
            run = []
    return out


class EpisodeRunner:
    """The per-stage logic of episodes of one task; the dispatchers call it.

    `lm_step(episodes, rows)` samples the next turn of each episode in one `Sampler` call of
    `rows` rows (the episodes padded with copies of the last one: fixed shapes, one compiled
    program per row count) with the parameters `params_source()` returns as (params, version).
    `init_call`, `tool_call` and `reward_call` return the (fn, *args) job an executor runs;
    `on_init`, `on_tool` and `on_reward` take its result. Single-process (the episode loop is
    host Python); the sampler's arrays are placed on `mesh`."""

    def __init__(self, task: ToolTask, tokenizer: Tokenizer, sampler: Sampler,
                 config: AgentConfig, *, prompt_len: int, mesh,
                 params_source: Callable[[], tuple[Any, int]] | None = None,
                 key: jax.Array | None = None):
        if jax.process_count() > 1:
            raise NotImplementedError("agent episodes run on one process (host-side loop)")
        self.task, self.tokenizer, self.sampler, self.config = task, tokenizer, sampler, config
        self.prompt_len, self.mesh = prompt_len, mesh
        self.width = prompt_len + config.episode_tokens  # the LM's context, left-padded
        self.params_source = params_source
        self.key = jax.random.key(0) if key is None else key
        self.lm_calls = 0  # LM calls, and their real and padded rows (for the metrics)
        self.lm_rows = 0
        self.lm_padded = 0

    def episodes(self, examples: Sequence[Example], group: int, first_uid: int
                 ) -> list[Episode]:
        """`group` episodes per example (example i -> episodes [i*group, (i+1)*group)), uids
        from `first_uid`; their prompts must fit prompt_len tokens."""
        out = []
        for i, ex in enumerate(examples):
            ids = self.tokenizer.encode(ex.prompt)
            if len(ids) > self.prompt_len:
                raise ValueError(f"prompt {i} needs {len(ids)} tokens, more than "
                                 f"prompt_len={self.prompt_len}: {ex.prompt[:40]!r}")
            out += [Episode(first_uid + i * group + g, ex, ids) for g in range(group)]
        return out

    # ---------------------------------------------------------------- stages

    def init_call(self, ep: Episode) -> tuple:
        return (init_episode, self.task, ep.example)

    def on_init(self, ep: Episode, context: Any) -> None:
        ep.context, ep.pending = context, "lm"

    def lm_step(self, episodes: Sequence[Episode], rows: int) -> None:
        """One model turn of each episode (all pending "lm"), in one sampler call of `rows`
        rows; each episode moves on to "tool", "lm" (after an error observation) or "reward"."""
        n = len(episodes)
        if not 0 < n <= rows:
            raise ValueError(f"lm_step: {n} episodes for {rows} rows")
        params, version = self.params_source()
        ids = np.full((rows, self.width), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((rows, self.width), bool)
        seq_ids = np.zeros(rows, np.int32)
        for r in range(rows):
            ep = episodes[min(r, n - 1)]
            ctx = ep.prompt_ids + ep.tokens
            ids[r, self.width - len(ctx):], mask[r, self.width - len(ctx):] = ctx, True
            seq_ids[r] = ep.uid * self.config.max_turns + ep.turns
        prompt, prompt_mask, seq = shard_batch((ids, mask, seq_ids), self.mesh)
        out = self.sampler(params, prompt, prompt_mask, self.key, seq_ids=seq)
        tokens, logprobs, lengths = (host_local(x) for x in (out.tokens, out.logprobs,
                                                              out.lengths))
        self.lm_calls, self.lm_rows, self.lm_padded = (self.lm_calls + 1, self.lm_rows + n,
                                                       self.lm_padded + rows)
        for r, ep in enumerate(episodes):
            self._apply_turn(ep, tokens[r, : lengths[r]], logprobs[r, : lengths[r]], version)

    def _apply_turn(self, ep: Episode, tokens: np.ndarray, logprobs: np.ndarray,
                    version: int) -> None:
        room = self.config.episode_tokens - len(ep.tokens)
        if len(tokens) > room:
            tokens, logprobs, ep.truncated = tokens[:room], logprobs[:room], True
        ep.tokens += tokens.tolist()
        ep.logprobs += logprobs.astype(np.float32).tolist()
        ep.policy += [True] * len(tokens)
        ep.versions += [version] * len(tokens)
        ep.turns += 1
        text = self.tokenizer.decode(tokens)
        turn = self.task.parse_turn(text)
        if turn.kind == "answer" or ep.truncated or ep.turns >= self.config.max_turns:
            ep.final, ep.pending = text, "reward"
            if turn.kind == "malformed":
                ep.format_errors += 1
            return
        if turn.kind == "malformed":
            ep.format_errors += 1
            self._observe(ep, f"error: {turn.error}", text)
        elif not self.config.tools or turn.name not in self.task.tools:
            ep.tool_calls += 1
            ep.tool_errors += 1
            allowed = ", ".join(self.task.tools) if self.config.tools else "none"
            self._observe(ep, f"error: no tool {turn.name[:40]!r} here (tools: {allowed})",
                          text)
        else:
            ep.call, ep.pending, ep.final = turn, "tool", text

    def tool_call(self, ep: Episode) -> tuple:
        return (run_tool, ep.call.name, ep.call.args, ep.context, self.config.obs_chars)

    def on_tool(self, ep: Episode, out: ToolOutput) -> None:
        ep.tool_calls += 1
        ep.tool_errors += not out.ok
        ep.call = None
        self._observe(ep, out.text, ep.final)

    def _observe(self, ep: Episode, text: str, last_turn: str) -> None:
        """Append an observation; the episode goes back to the LM, or to its reward when the
        sequence is full."""
        obs = self.tokenizer.encode(self.task.observation(text[: self.config.obs_chars]))
        room = self.config.episode_tokens - len(ep.tokens)
        if len(obs) >= room:  # no room left for another turn
            ep.truncated = True
            obs = obs[:room]
        ep.tokens += obs
        ep.logprobs += [0.0] * len(obs)
        ep.policy += [False] * len(obs)
        ep.versions += [-1] * len(obs)
        ep.final = last_turn
        ep.pending = "reward" if ep.truncated else "lm"

    def reward_call(self, ep: Episode) -> tuple:
        return (score_episode, self.task, ep.final, ep.example)

    def on_reward(self, ep: Episode, result: tuple[float, str | None]) -> None:
        ep.score, ep.outcome = result
        ep.pending = "done"

    # ---------------------------------------------------------------- batches

    def collate(self, episodes: Sequence[Episode]):
        """Host arrays of finished episodes in the GRPO layout: (SeqBatch with loss_mask =
        the policy's tokens, behaviour log-probs [R, N], versions [R, N] (-1 off the policy's
        tokens), rewards [R]: each episode's `reward`, or its `score` when it has none)."""
        r, n = len(episodes), self.config.episode_tokens
        prompt, prompt_mask = self.tokenizer.encode_batch(
            [ep.example.prompt for ep in episodes], self.prompt_len)
        tokens = np.full((r, n), self.tokenizer.pad_id, np.int32)
        mask, loss_mask, logp = (np.zeros((r, n), np.float32) for _ in range(3))
        versions = np.full((r, n), -1, np.int32)
        for i, ep in enumerate(episodes):
            t = len(ep.tokens)
            tokens[i, :t], mask[i, :t] = ep.tokens, 1.0
            loss_mask[i, :t], logp[i, :t] = ep.policy, ep.logprobs
            versions[i, :t] = ep.versions
        seq = SeqBatch(prompt, prompt_mask, tokens, mask, loss_mask)
        rewards = [ep.score if ep.reward is None else ep.reward for ep in episodes]
        return seq, logp, versions, np.array(rewards, np.float32)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Success (score == 1), mean score, turns, tool calls per episode, format-failure rate
    (malformed turns / model turns), tool-error rate (failed calls / calls), the share of
    episodes cut by the token budget, the outcome labels' shares, and where episodes have an
    episode-level reward its mean ("reward") and its components' means ("reward_<name>")."""
    turns = sum(ep.turns for ep in episodes)
    calls = sum(ep.tool_calls for ep in episodes)
    n = max(len(episodes), 1)
    out = {
        "success": sum(ep.score == 1.0 for ep in episodes) / n,
        "score": sum(ep.score for ep in episodes) / n,
        "turns": turns / n,
        "tool_calls": calls / n,
        "format_fail_rate": sum(ep.format_errors for ep in episodes) / max(turns, 1),
        "tool_error_rate": sum(ep.tool_errors for ep in episodes) / max(calls, 1),
        "truncated_frac": sum(ep.truncated for ep in episodes) / n,
        "episode_tokens": sum(len(ep.tokens) for ep in episodes) / n,
    }
    labels = [ep.outcome for ep in episodes if ep.outcome]
    for k in sorted(set(labels)):
        out[f"outcome_{k}"] = labels.count(k) / n
    rewarded = [ep for ep in episodes if ep.reward is not None]
    if rewarded:
        out["reward"] = sum(ep.reward for ep in rewarded) / len(rewarded)
    for k in sorted({k for ep in episodes for k in ep.components}):
        vals = [ep.components[k] for ep in episodes if k in ep.components]
        out[f"reward_{k}"] = sum(vals) / len(vals)
    return out


def expert_episodes(runner: EpisodeRunner, examples: Sequence[Example], *, executor=None,
                    first_uid: int = 0) -> list[Episode]:
    """The scripted expert's episodes (`ToolTask.expert_turns`, with or without tools as
    agent.tools says), its tool calls answered by the real tools (through `executor` when
    given, concurrently), in the same token layout as the policy's; scored by the task."""
    eps = runner.episodes(examples, 1, first_uid)
    scripts = [list(runner.task.expert_turns(ep.example, tools=runner.config.tools))
               for ep in eps]
    for ep in eps:
        ep.context = init_episode(runner.task, ep.example)
    active = list(zip(eps, scripts, strict=True))
    while active:
        for ep, script in active:
            turn = runner.tokenizer.encode(script.pop(0)) + [runner.tokenizer.eos_id]
            runner._apply_turn(ep, np.asarray(turn), np.zeros(len(turn), np.float32), -1)
            if ep.pending == "lm" and not script:
                ep.pending = "reward"  # the script ended without an answer
        calls = [ep for ep, _ in active if ep.pending == "tool"]
        results = _run_jobs([runner.tool_call(ep) for ep in calls], executor)
        for ep, out in zip(calls, results, strict=True):
            runner.on_tool(ep, out)
        active = [(ep, s) for ep, s in active if ep.pending == "lm" and s]
    for ep, res in zip(eps, _run_jobs([runner.reward_call(ep) for ep in eps], executor),
                       strict=True):
        runner.on_reward(ep, res)
    return eps


def _run_jobs(jobs: Sequence[tuple], executor) -> list:
    """Run (fn, *args) jobs, concurrently on `executor` when given, in order."""
    if executor is None:
        return [fn(*args) for fn, *args in jobs]
    futures = [executor.submit(fn, *args) for fn, *args in jobs]
    return [f.result() for f in futures]


class EpisodeSFT:
    """SFT on expert episodes (`expert_episodes`): teacher forcing on the expert's turns only
    (the tool outputs are context, masked out of the loss). A fixed set of `demos` episodes is
    built once (its tool calls run once), then cycled in seeded shuffled order; follows the
    `fit` protocol (batch(cursor) -> episodes, step(state, episodes))."""

    def __init__(self, sft: SFTTrainer, runner: EpisodeRunner, demos: Sequence[Episode], *,
                 seed: int = 0):
        if not demos:
            raise ValueError("EpisodeSFT: no demonstrations")
        self.sft, self.runner, self.demos, self.seed = sft, runner, list(demos), seed
        self.trainable = sft.trainable

    def init_state(self, params, rng) -> TrainState:
        return self.sft.init_state(params, rng)

    def batch(self, cursor: int) -> list[Episode]:
        n, size = len(self.demos), self.sft.config.batch_size
        out = []
        for i in range(cursor, cursor + size):
            epoch, j = divmod(i, n)
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            out.append(self.demos[int(order[j])])
        return out

    def step(self, state: TrainState, episodes: Sequence[Episode]):
        seq = self.runner.collate(episodes)[0]
        return self.sft._update(state, shard_batch(seq, self.sft.mesh))


class ParamStore:
    """The newest parameters and their version (the number of updates behind them), shared
    between the trainer (`publish`) and the rollout thread (`latest`, `wait_for`)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._params, self._version = None, -1

    def publish(self, params, version: int) -> None:
        with self._cond:
            self._params, self._version = params, version
            self._cond.notify_all()

    def latest(self) -> tuple[Any, int]:
        with self._cond:
            return self._params, self._version

    def wait_for(self, version: int, stop: threading.Event) -> bool:
        """Block until the published version is >= `version` (False if `stop` is set)."""
        with self._cond:
            while self._version < version and not stop.is_set():
                self._cond.wait(timeout=0.1)
            return not stop.is_set()


class AgentTrainer:
    """GRPO over whole tool-use episodes, on a `GRPOTrainer` (its sampler, loss and update).

    step(state, examples): G episodes per example run by the configured dispatcher, then
    `GRPOTrainer.update` on their trajectories (loss mask = the policy's tokens) with the
    episode scores as rewards. With agent.max_staleness = s > 0 the rollouts of the next s
    steps are generated in a background thread while this one updates (see the module
    docstring); `close()` stops it. Follows the `fit` protocol.

    episode_reward(episodes): an optional episode-level reward, called on each finished batch
    of episodes (training rollouts and `episodes`/`evaluate`) before it is used; it may set
    each episode's `score`, `reward` (the training reward, when it is not the score) and
    `components`. For rewards that need the whole trajectory (`episode_segments`) or a model
    (the s3 searcher's frozen generator), which the per-episode reward stage cannot run."""

    def __init__(self, grpo: GRPOTrainer, config: AgentConfig, *, executor=None,
                 reward_executor=None, dispatcher: Callable | None = None,
                 episode_reward: Callable[[list[Episode]], None] | None = None):
        if not isinstance(grpo.task, ToolTask):
            raise ValueError(f"AgentTrainer needs a ToolTask, got {type(grpo.task).__name__}")
        self.grpo, self.config = grpo, config
        self.episode_reward = episode_reward
        self.executor = executor or make_executor(config.executor, config.workers)
        self.reward_executor = reward_executor or make_executor(config.executor, config.workers)
        self._own = [e for e, given in ((self.executor, executor),
                                        (self.reward_executor, reward_executor)) if given is None]
        self.dispatch = dispatcher or DISPATCH[config.dispatcher]
        need = grpo.prompt_len + config.episode_tokens + grpo.config.max_new_tokens
        if need > grpo.model.config.max_len:
            raise ValueError(f"agent.episode_tokens={config.episode_tokens}: a turn's context "
                             f"(prompt_len {grpo.prompt_len} + episode_tokens + "
                             f"grpo.max_new_tokens {grpo.config.max_new_tokens} = {need}) "
                             f"exceeds model.max_len={grpo.model.config.max_len}")
        if grpo.config.dynamic_sampling and (config.max_staleness or config.background):
            raise ValueError("grpo.dynamic_sampling needs on-policy rollouts in the trainer's "
                             "thread: set agent.max_staleness=0 and agent.background=false")
        self.store = ParamStore()
        self.runner = self.make_runner(grpo.sampler, self.store.latest)
        self.trainable = grpo.trainable
        self._cursor = 0
        self._thread: threading.Thread | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._results: dict[int, Any] = {}
        self._results_cv = threading.Condition()
        self._requested: set[int] = set()
        self._stop = threading.Event()

    def make_runner(self, sampler: Sampler, params_source, key=None) -> EpisodeRunner:
        return EpisodeRunner(self.grpo.task, self.grpo.tokenizer, sampler, self.config,
                             prompt_len=self.grpo.prompt_len, mesh=self.grpo.mesh,
                             params_source=params_source, key=key)

    def init_state(self, params, rng, *, anchor: float | None = None):
        """`GRPOTrainer.init_state`: everything a run's episodes depend on is in it (the
        sampling key is its `rng`)."""
        return self.grpo.init_state(params, rng, anchor=anchor)

    def batch(self, cursor: int) -> list[Example]:
        """The tasks of the step at data `cursor` (the `fit` loop's, checkpointed beside the
        state), which it remembers: with agent.max_staleness the step also queues the next
        steps' tasks, at the cursors that follow."""
        self._cursor = cursor
        return self.grpo.batch(cursor)

    def run_episodes(self, runner: EpisodeRunner, episodes: list[Episode]) -> list[Episode]:
        """The configured dispatcher over `episodes` (all at once unless agent.concurrency)."""
        c = self.config
        concurrency = c.concurrency or len(episodes)
        return self.dispatch(runner, episodes, self.executor, self.reward_executor,
                             concurrency=concurrency, lm_batch=c.lm_batch or concurrency,
                             min_lm_batch=c.min_lm_batch)

    def _rollout(self, step: int, examples: Sequence[Example]) -> tuple[list[Episode], float]:
        g = self.grpo.config.group_size
        t0 = time.perf_counter()
        episodes = self.runner.episodes(examples, g, first_uid=step * len(examples) * g)
        episodes = self.run_episodes(self.runner, episodes)
        if self.episode_reward is not None:
            self.episode_reward(episodes)
        return episodes, time.perf_counter() - t0

    def _worker(self) -> None:
        """The background rollout thread: job j starts once version >= j - max_staleness."""
        while not self._stop.is_set():
            try:
                step, examples = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            if not self.store.wait_for(step - self.config.max_staleness, self._stop):
                return
            try:
                result = self._rollout(step, examples)
            except BaseException as e:  # noqa: BLE001 - re-raised in the trainer's thread
                result = e
            with self._results_cv:
                self._results[step] = result
                self._results_cv.notify_all()

    def _request(self, step: int, examples: Sequence[Example]) -> None:
        if step not in self._requested:
            self._requested.add(step)
            self._jobs.put((step, list(examples)))

    def _wait(self, step: int):
        with self._results_cv:
            while step not in self._results:
                self._results_cv.wait(timeout=0.1)
            result = self._results.pop(step)
        if isinstance(result, BaseException):
            raise result
        return result

    def step(self, state, examples: Sequence[Example]):
        """One GRPO update on G episodes per task of `examples`. The episodes' sampling key is
        the state's (`rng`) and the rollout engine continues from its learning state, so a
        resumed run, or a new one on this trainer, samples as the uninterrupted run would."""
        k, s = int(state.step), self.config.max_staleness
        t0 = time.perf_counter()
        self.runner.key = jax.random.wrap_key_data(state.rng)
        self.grpo.use_sampler_state(state)
        self.store.publish(state.params, k)
        if self.grpo.config.dynamic_sampling:  # on-policy only (checked in __init__)
            return self._dynamic_step(state, examples, t0)
        if self._thread is None and (s > 0 or self.config.background):
            self._thread = threading.Thread(target=self._worker, daemon=True,
                                            name="agent-rollouts")
            self._thread.start()
        if self._thread is None:
            episodes, gen_time = self._rollout(k, examples)
        else:
            b = len(examples)
            self._request(k, examples)
            for j in range(k + 1, k + s + 1):
                self._request(j, self.grpo.batch(self._cursor + (j - k) * b))
            episodes, gen_time = self._wait(k)
        wait_time = time.perf_counter() - t0
        return self.update(state, episodes, gen_time=gen_time, wait_time=wait_time, t0=t0)

    def _dynamic_step(self, state, pool: Sequence[Example], t0: float):
        """grpo.dynamic_sampling over whole episodes (`GRPOTrainer.dynamic_rollout`'s rule,
        `select_groups`): G episodes of B tasks of the pool at a time until B groups whose
        rewards differ are found or the pool is spent; free places hold all-equal groups with
        no loss term. Draw d of step k runs as rollout k * max_draws + d (its episode ids)."""
        k, c = int(state.step), self.grpo.config
        b, g = c.prompts_per_step, c.group_size

        def draw(d):
            episodes, dt = self._rollout(k * c.max_draws + d, pool[d * b : (d + 1) * b])
            groups = [episodes[i * g : (i + 1) * g] for i in range(b)]
            return (groups, dt), [[ep.score if ep.reward is None else ep.reward for ep in grp]
                                  for grp in groups]

        out, draws, chosen, filled = draw_until_full(draw, len(pool) // b, b)
        episodes = [ep for d, i in chosen for ep in out[d][0][i]]
        state, metrics = self.update(state, episodes, gen_time=sum(o[1] for o in out), t0=t0,
                                     loss_groups=filled)
        success = episode_metrics([ep for o in out for grp in o[0] for ep in grp])["success"]
        metrics.update(pool_metrics(draws, filled, b), accuracy=success)
        return state, metrics

    def update(self, state, episodes: Sequence[Episode], *, gen_time: float = 0.0,
               wait_time: float | None = None, t0: float | None = None,
               loss_groups: int | None = None):
        """`GRPOTrainer.update` on finished episodes (G per task, in task order). Tokens
        sampled by an older parameter version than the state's get the current parameters'
        log-probs as old log-probs and a truncated importance weight on the recorded ones.
        `loss_groups`: only the first this many groups carry loss terms (dynamic sampling's
        fillers after them are masked out); None = all."""
        k = int(state.step)
        seq, logp, versions, scores = self.runner.collate(episodes)
        g = self.grpo.config.group_size
        if loss_groups is not None:
            keep = (np.arange(len(episodes)) < loss_groups * g)[:, None]
            seq = seq._replace(loss_mask=seq.loss_mask * keep.astype(np.float32))
        rewards = scores.reshape(-1, g)
        policy = seq.loss_mask > 0
        stale = policy & (versions < k)
        seq_d = shard_batch(seq, self.grpo.mesh)
        behaviour = None
        if stale.any():  # off-policy tokens: the current policy is the old one of the ratio
            current = np.asarray(host_local(self.grpo.completion_logprobs(state.params, seq_d)))
            old = np.where(stale, current, logp).astype(np.float32)
            behaviour = shard_batch(logp, self.grpo.mesh)
        else:
            old = logp
        lag = np.where(policy, k - versions, 0)
        metrics_ep = episode_metrics(episodes)
        info = {"accuracy": metrics_ep["success"], "length": float(seq.completion_mask.sum(1)
                                                                    .mean()),
                "tokens": int(policy.sum()), "gen_time": wait_time if wait_time is not None
                else gen_time}
        state, metrics = self.grpo.update(state, seq_d, shard_batch(old, self.grpo.mesh),
                                          rewards, info, t0=t0, behaviour_logp=behaviour)
        metrics.update(metrics_ep)
        metrics.update(rollout_time=gen_time, stale_token_frac=float(stale.sum() /
                                                                      max(policy.sum(), 1)),
                       max_staleness=float(lag.max()),
                       lm_fill=self.runner.lm_rows / max(self.runner.lm_padded, 1))
        return state, metrics

    def episodes(self, params, examples: Sequence[Example], *,
                 sampler: Sampler | None = None) -> list[Episode]:
        """One finished episode per example with `params`, by the trainer's greedy sampler
        (or `sampler`), through the configured dispatcher."""
        runner = self.make_runner(sampler or self.grpo.greedy_sampler, lambda: (params, -1))
        episodes = self.run_episodes(runner, runner.episodes(examples, 1, first_uid=0))
        if self.episode_reward is not None:
            self.episode_reward(episodes)
        return episodes

    def evaluate(self, params, examples: Sequence[Example], *, sampler: Sampler | None = None
                 ) -> dict[str, float]:
        """`episode_metrics` of greedy episodes on `examples` (see `episodes`)."""
        return episode_metrics(self.episodes(params, examples, sampler=sampler))

    def close(self) -> None:
        """Stop the rollout thread and shut down the executors this trainer made."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        for ex in self._own:
            ex.shutdown()
        self._own = []


__all__ = [
    "AgentConfig",
    "AgentTrainer",
    "Episode",
    "EpisodeRunner",
    "EpisodeSFT",
    "ParamStore",
    "episode_metrics",
    "episode_segments",
    "expert_episodes",
    "init_episode",
    "score_episode",
]
