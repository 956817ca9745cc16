"""Every combination of modes is tried (issue 37): estimator x reward level x KL mode x dynamic
sampling x ratio source, on one synthetic step of small groups, through the trainer's own
judgement (`Guards.carries`, `SyncGroups.refill`, `Guards.watch_signal` on a fake trainer), the advantages,
the TrainBatch and its micro-batches, and the loss.

Legend: G group, T tokens (of one trajectory), N tokens (of a batch).

What each case checks, per group of the step:
1. non-zero advantages (before step whitening) => `carries_gradient` (dynamic sampling keeps the
   group, the no-signal warning stays quiet);
2. judged not carrying => every advantage 0 (after step whitening: one common shift, nothing
   compared within the group), and with kl_mode != loss no gradient reaches its tokens;
3. infrastructure failures (sandbox_unavailable, aborted) get advantage 0 and leave the baseline
   as it would be without them;
4. the advantages reach the TrainBatch's loss-masked tokens, through micro-batches and back; what
   the batch leaves out is an infrastructure failure (counted) or has no sampled token;
5. adv/zero_std_groups agrees with `carries_gradient`.
"""

from __future__ import annotations

import asyncio
import io
import itertools
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from rich.console import Console
from torch import Tensor

from agentrl.advantage import ESTIMATORS as REGISTRY
from agentrl.advantage import (
    SIGNAL_ATOL,
    compute_advantages,
    needs_values,
)
from agentrl.batch import TrainBatch, micro_batches, per_trajectory
from agentrl.config import Config
from agentrl.groups import SyncGroups
from agentrl.loss import LossInputs, get_loss, kl_reward_penalty, reduce_metrics
from agentrl.metrics import rollout_metrics
from agentrl.train import make_guards
from agentrl.types import FinishReason, Message, StopReason, Trajectory, Turn

ESTIMATORS = ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline", "gae"]
LEVELS = ["trajectory", "turn"]
KL_MODES = ["none", "loss", "reward"]
# the ratio's denominator: the engine's logprobs, or the trainer's pi_old (recomputed before the
# update, or taken from the update's own forward: algo.old_logprobs=auto with one optimizer step)
RATIOS = ["engine", "trainer/recompute", "trainer/auto"]
SAND, ABORT, OK = StopReason.SANDBOX_UNAVAILABLE, StopReason.ABORTED, StopReason.COMPLETED


def traj(
    reward: float,
    turn_rewards: tuple[float | None, ...] = (None, None),
    sampled: int = 2,
    stop: StopReason = OK,
    index: int = 0,
) -> Trajectory:
    """Prompt of 2 tokens, then per turn `sampled` sampled tokens and 1 observation token.
    Engine logprobs differ by `index`, so the members' KL to the reference differs."""
    pos, turns, mask = 2, [], [0, 0]
    for r in turn_rewards:
        turns.append(Turn(start=pos, end=pos + sampled, obs_end=pos + sampled + 1,
                          weight_version="0", finish_reason=FinishReason.STOP,
                          assistant=Message(role="assistant"), reward=r))  # fmt: skip
        mask += [1] * sampled + [0]
        pos += sampled + 1
    lp = [(-0.5 - 0.1 * index) * m for m in mask]
    return Trajectory(task_id="t", sample_index=index, token_ids=list(range(pos)), loss_mask=mask,
                      logprobs=lp, prompt_len=2, turns=turns, messages=[], stop_reason=stop,
                      reward=reward)  # fmt: skip


def group(*members: tuple) -> list[Trajectory]:
    return [traj(*m[:2], **m[2] if len(m) > 2 else {}, index=i) for i, m in enumerate(members)]


def live_group() -> list[Trajectory]:
    return group((1.0, (None, None)), (0.0, (None, None)), (0.0, (None, None)))


def step_groups() -> dict[str, list[Trajectory]]:
    """One step's groups, by what they test. Rewards are dyadic: exact baselines, no rounding."""
    return {
        "outcomes_differ": live_group(),
        "all_equal": group((1.0, (None, None)), (1.0, (None, None)), (1.0, (None, None))),
        # the finding: equal outcomes, per-turn rewards differ (signal only at turn level)
        "turn_rewards_differ": group((1.0, (0.5, 0.0)), (1.0, (0.0, 0.0))),
        "equal_turn_rewards": group((1.0, (0.5, 0.0)), (1.0, (0.5, 0.0))),
        # infra failures with rewards that would move the baseline if they counted
        "infra_members": group(
            (1.0, (None, None)),
            (0.0, (None, None)),
            (8.0, (None, None), {"stop": SAND}),
            (-4.0, (None, None), {"stop": ABORT}),
        ),
        "lone_valid": group((1.0, (None, None)), (0.0, (None, None), {"stop": ABORT})),
        # turn 1 reached by one member only: nothing to compare it with at turn level
        "uneven_turns": group((1.0, (None, None)), (0.0, (None,)), (0.5, (None,))),
        "no_sampled_token": group((1.0, (None,), {"sampled": 0}), (0.0, (None,), {"sampled": 0})),
    }


class FakeTrainer:
    """The trainer's own dynamic sampling (`SyncGroups.refill`) and no-signal warning
    (`Guards.watch_signal`) on a config, with a scripted rollout for refills."""

    def __init__(self, cfg: Config, refills: list[list[Trajectory]] | None = None) -> None:
        self.cfg = cfg
        self.warnings: list[str] = []
        self.refills = list(refills or [])
        quiet = Console(file=io.StringIO())
        self.guards = make_guards(cfg, quiet, lambda title, msg: self.warnings.append(title))
        self.sampler = SimpleNamespace(next=lambda n: [f"task{i}" for i in range(n)])
        self.rollout = SimpleNamespace(run=self._run)

    def _carries(self, group: list[Trajectory]) -> bool:
        """The run's estimator and reward level, and whether the KL goes into the reward
        (kl_mode=reward with kl_coef > 0)."""
        return self.guards.carries(group)

    async def _refill(self, groups, want: int, max_rounds: int):
        source = SyncGroups(self.sampler, self.rollout, self._reissue, want,  # type: ignore[arg-type]
                            keep=self.guards.keep, max_refill_rounds=max_rounds)  # fmt: skip
        return await source.refill(groups, step=1)

    def _watch_signal(self, groups: list[list[Trajectory]], metrics: dict[str, float]) -> None:
        self.guards.watch_signal(groups, metrics)

    async def _run(self, tasks: list[str]) -> list[list[Trajectory]]:
        out, self.refills = self.refills[: len(tasks)], self.refills[len(tasks) :]
        return out

    async def _reissue(self, tasks, groups, step):
        return groups, {}


def make_config(estimator: str, level: str, kl: str, dynamic: bool, ratio: str) -> Config:
    """The run's config; a combination it refuses is skipped with the reason."""
    loss: dict = {"ratio": ratio.split("/")[0]}
    if kl != "none":
        loss.update(kl_coef=0.05, kl_mode=kl)
    algo = {"advantage": {"name": estimator, "reward_level": level}, "loss": loss,
            "old_logprobs": ratio.split("/")[1] if "/" in ratio else "auto"}  # fmt: skip
    try:
        return Config(env={"_target_": "agentrl.envs.code_exec:CodeExecEnv"}, algo=algo,
                      trainer={"sampling": {"dynamic_sampling": dynamic},
                               "guards": {"no_signal_steps": 1}})  # fmt: skip
    except ValidationError as e:
        pytest.skip(f"config refuses {estimator}/{level}/{kl}/{dynamic}/{ratio}: {e}")


def fake_scores(trajs: list[Trajectory], cfg: Config) -> dict[str, list[Tensor] | None]:
    """What the learner would score before the advantages: pi_old, the reference's logprobs,
    critic values, and the KL reward penalty from them (train.py: Trainer._score)."""
    loss = cfg.algo.loss
    old = [torch.tensor(t.logprobs) + 0.01 * torch.tensor(t.loss_mask) for t in trajs]
    ref = [
        lp - 0.1 * (t.sample_index + 1) * torch.tensor(t.loss_mask)
        for lp, t in zip(old, trajs, strict=True)
    ]
    values = None
    if cfg.algo.uses_critic():
        values = [0.25 * (torch.arange(len(t.token_ids)) % 3).float() for t in trajs]
    penalties = None
    if cfg.algo.kl_in_reward():
        masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]
        penalties = [kl_reward_penalty(o, r, m, loss.kl_coef, loss.kl_kind)
                     for o, r, m in zip(old, ref, masks, strict=True)]  # fmt: skip
    return {
        "trainer_old_logprobs": None if cfg.algo.old_logprobs_from_update() else old,
        "ref_logprobs": ref if cfg.algo.reference or loss.kl_coef > 0 else None,
        "values": values,
        "penalties": penalties,
    }


def masked(a: Tensor, t: Trajectory) -> Tensor:
    return a[torch.tensor(t.loss_mask, dtype=torch.bool)]


def amax(x: Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def is_flat(advs: list[Tensor], members: list[Trajectory]) -> bool:
    """No valid member's sampled token has an advantage above SIGNAL_ATOL in size."""
    return all(
        amax(masked(a, t)) <= SIGNAL_ATOL
        for a, t in zip(advs, members, strict=True)
        if not t.stop_reason.is_infra_failure
    )


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: more threads only spin (and on a busy machine, wait)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CASES = list(itertools.product(ESTIMATORS, LEVELS, KL_MODES, [False, True], RATIOS))


@pytest.mark.parametrize(("estimator", "level", "kl", "dynamic", "ratio"), CASES)
def test_mode_matrix(estimator: str, level: str, kl: str, dynamic: bool, ratio: str) -> None:
    cfg = make_config(estimator, level, kl, dynamic, ratio)
    acfg, lcfg = cfg.algo.advantage, cfg.algo.loss
    exact = not needs_values(estimator) and kl != "reward"  # no value known only later
    named = step_groups()
    # dynamic sampling: the trainer's _refill keeps the groups that carry gradient and rolls
    # out more (here: a fresh copy of a live group) until the step has as many
    want = len(named)
    trainer = FakeTrainer(cfg, refills=[live_group() for _ in range(want)])
    judged = {k: trainer._carries(g) for k, g in named.items()}
    if dynamic:
        groups, m = asyncio.run(trainer._refill(list(named.values()), want, 1))
        assert m["rollout/filtered_groups"] == sum(not j for j in judged.values())
        kept_names = [k for k, j in judged.items() if j]
        assert groups[: len(kept_names)] == [named[k] for k in kept_names]
        assert len(groups) == want  # one refill round brought the rest, all carrying
    else:
        groups = list(named.values())
    trajs = [t for g in groups for t in g]
    group_of = [j for j, g in enumerate(groups) for _ in g]
    scores = fake_scores(trajs, cfg)
    out = compute_advantages(groups, acfg, scores["values"], scores["penalties"])
    whitens = acfg.whiten if acfg.whiten is not None else REGISTRY.meta(estimator)["whiten"]
    raw = out.advantages  # the advantages before step whitening
    if whitens:
        raw_cfg = acfg.model_copy(update={"whiten": False})
        raw = compute_advantages(groups, raw_cfg, scores["values"], scores["penalties"]).advantages
    carrying = [trainer._carries(g) for g in groups]

    # 1, 2, 5: per group, the judgement against the advantages (and the no-signal warning)
    at, flat_groups, valid_groups = 0, 0, 0
    for g, carries in zip(groups, carrying, strict=True):
        adv_g, raw_g = out.advantages[at : at + len(g)], raw[at : at + len(g)]
        at += len(g)
        flat = is_flat(raw_g, g)
        if not flat:
            assert carries, f"non-zero advantages in a group judged flat: {g[0].task_id}"
        if not carries:
            assert flat
            shift = {round(float(x), 5) for a, t in zip(adv_g, g, strict=True) for x in masked(a, t)
                     if not t.stop_reason.is_infra_failure}  # fmt: skip
            assert len(shift) <= 1 and (whitens or shift <= {0.0})
        if exact:
            assert carries == (not flat)
        if any(not t.stop_reason.is_infra_failure for t in g):
            valid_groups += 1
            flat_groups += flat
    assert out.metrics["adv/zero_std_groups"] == pytest.approx(flat_groups / valid_groups)
    not_carrying = carrying.count(False)
    if exact:
        assert out.metrics["adv/zero_std_groups"] == pytest.approx(not_carrying / valid_groups)
    trainer._watch_signal(groups, m := {})
    assert "no learning signal" not in trainer.warnings and m["train/no_signal_steps_in_a_row"] == 0
    # turn_rewards_differ is in every step; with dynamic sampling at trajectory level it is
    # dropped as flat, and the warning must still come (it used to see only the kept groups)
    ignored = "per-turn rewards ignored" in trainer.warnings
    assert ignored == (level == "trajectory")

    # 3: infrastructure failures: advantage 0, and the baseline is the one without them
    infra = [i for i, t in enumerate(trajs) if t.stop_reason.is_infra_failure]
    assert out.metrics["adv/infra_excluded"] == len(infra)
    assert all(amax(out.advantages[i]) == 0 for i in infra)
    keep = [i for i in range(len(trajs)) if i not in infra]
    without = [[t for t in g if not t.stop_reason.is_infra_failure] for g in groups]
    sub = {k: None if v is None else [v[i] for i in keep] for k, v in scores.items()}
    ref_out = compute_advantages(without, acfg, sub["values"], sub["penalties"])
    for i, a in zip(keep, ref_out.advantages, strict=True):
        torch.testing.assert_close(out.advantages[i], a)
    roll = rollout_metrics(trajs)
    assert roll["stop/sandbox_unavailable"] + roll["stop/aborted"] == len(infra)

    # 4: the advantages reach the batch's loss-masked tokens, and come back from micro-batches
    opt = {k: scores[k] for k in ("trainer_old_logprobs", "ref_logprobs", "values")}
    batch = TrainBatch.from_trajectories(trajs, out.advantages, returns=out.returns, **opt)
    dropped = sorted(set(range(len(trajs))) - set(batch.source))
    for i in dropped:  # an infra failure (counted above) or no sampled token: no advantage lost
        assert i in infra or trajs[i].num_sampled == 0
        assert amax(out.advantages[i]) == 0
    assert batch.norm.num_tokens == sum(trajs[i].num_sampled for i in batch.source)
    for s, a_T in zip(batch.source, batch.per_sequence(batch.advantages), strict=True):
        assert torch.equal(a_T, out.advantages[s])
        assert torch.equal(batch.loss_mask[batch.seq_ids == batch.source.index(s)],
                           torch.tensor(trajs[s].loss_mask, dtype=torch.bool))  # fmt: skip
    per_rank = micro_batches(batch, 2, max_tokens=16)
    back = per_trajectory(per_rank, [[mb.advantages for mb in r] for r in per_rank],
                          [len(t.token_ids) for t in trajs])  # fmt: skip
    for i in range(len(trajs)):
        assert torch.equal(back[i], out.advantages[i] if i in batch.source else back[i] * 0)

    # the loss, with the ratio's denominator this config names; dropped groups get no gradient
    lps, ms = [], []
    for mbs in per_rank:
        for mb in mbs:
            lp = (mb.old_logprobs + 0.02 * (mb.position_ids % 2)).requires_grad_()
            extra = {}
            if mb.trainer_old_logprobs is None and cfg.algo.old_logprobs_from_update():
                extra["trainer_old_logprobs"] = lp.detach()  # learner/worker.py: _loss
            loss, metrics = get_loss(lcfg.name)(LossInputs.from_batch(mb, lp, **extra), lcfg)
            assert torch.isfinite(loss)
            loss.backward()
            lps.append((mb, lp))
            ms.append(metrics)
    red = reduce_metrics(ms)
    assert ("is_weight_mean" in red) == (lcfg.ratio == "trainer")
    if kl != "loss" and not whitens:  # KL in the loss moves every token; whitening shifts all
        for mb, lp in lps:
            if mb.is_padding:
                continue
            for src, g_T in zip(mb.source, mb.per_sequence(lp.grad), strict=True):
                if not carrying[group_of[src]]:
                    assert amax(g_T) == 0, "a dropped group moves the policy"


# ---------------------------------------------------------------------------------------------
# The findings, by name


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline"])
def test_turn_level_equal_outcomes_different_turn_rewards(estimator: str) -> None:
    cfg = make_config(estimator, "turn", "none", True, "trainer/auto")
    g = step_groups()["turn_rewards_differ"]
    assert FakeTrainer(cfg)._carries(g)
    raw = compute_advantages([g], cfg.algo.advantage.model_copy(update={"whiten": False}))
    assert not is_flat(raw.advantages, g)
    assert raw.metrics["adv/zero_std_groups"] == 0.0


def test_gae_with_equal_rewards_carries_gradient() -> None:
    cfg = make_config("gae", "trajectory", "none", True, "trainer/auto")
    g = step_groups()["all_equal"]
    assert FakeTrainer(cfg)._carries(g)
    values = fake_scores(g, cfg)["values"]
    out = compute_advantages([g], cfg.algo.advantage.model_copy(update={"whiten": False}), values)
    assert not is_flat(out.advantages, g)  # r_t + V_{t+1} - V_t moves with the critic


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline"])
def test_kl_reward_with_equal_rewards_carries_gradient(estimator: str) -> None:
    cfg = make_config(estimator, "trajectory", "reward", True, "trainer/recompute")
    g = step_groups()["all_equal"]
    judge = FakeTrainer(cfg)
    assert judge._carries(g)
    pens = fake_scores(g, cfg)["penalties"]
    raw = compute_advantages([g], cfg.algo.advantage.model_copy(update={"whiten": False}),
                             token_penalties=pens)  # fmt: skip
    assert not is_flat(raw.advantages, g)  # the members' KL differs: that is the signal
    no_kl = make_config(estimator, "trajectory", "none", True, "trainer/recompute")
    assert not FakeTrainer(no_kl)._carries(g)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline"])
def test_turn_rewards_at_trajectory_level_are_ignored_and_warned(estimator: str) -> None:
    cfg = make_config(estimator, "trajectory", "none", True, "trainer/auto")
    g = step_groups()["turn_rewards_differ"]
    trainer = FakeTrainer(cfg)
    assert not trainer._carries(g)
    out = compute_advantages([g], cfg.algo.advantage)
    assert all(amax(a) == 0 for a in out.advantages)
    trainer._watch_signal([g], {})
    assert trainer.warnings == ["per-turn rewards ignored", "no learning signal"]
