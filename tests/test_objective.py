"""The shared policy objective (``sorl_monitor.remedy.objective``) against hand computations on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from sorl_monitor.remedy.ctn import AdaptiveCtnCoef
from sorl_monitor.remedy.objective import (
    ObjectiveSettings,
    ctn_pull_share,
    kl_k3_capped,
    policy_objective,
    surrogate_ratio,
    turn_group_advantages,
    turn_ids_from_mask,
)

# one row: turn 0 = tokens 0-1, a tool output (2), turn 1 = tokens 3-5, padding (6)
MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
LOG_R = torch.tensor([[math.log(2.0), math.log(0.5), 0.7, math.log(1.5), math.log(1.5), math.log(4.0), 0.0]])


def test_token_ppo_at_ratio_one_is_minus_the_mean_advantage_with_no_ctn():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    terms = policy_objective(logp, logp.detach(), adv, mask, turn_level=False, ctn_coef=32.0)
    assert terms.pg_loss.item() == pytest.approx(-(1.0 - 2.0 + 4.0) / 3)
    assert terms.ctn_penalty.item() == 0.0 and terms.clip_frac.item() == 0.0
    terms.loss.backward()  # ∂L/∂logp_t = −A_t / n at ratio 1 (no token clipped)
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, 2 / 3, 0.0, -4 / 3])


def test_turn_ratio_of_a_known_mask_in_both_forms():
    turn_ids = turn_ids_from_mask(MASK)
    assert turn_ids.tolist() == [[0, 0, -1, 1, 1, 1, -1]]
    geo = surrogate_ratio(LOG_R, turn_ids, MASK, turn_level=True, form="geomean")
    mean = surrogate_ratio(LOG_R, None, MASK, turn_level=True, form="mean")
    turn1_geo = (1.5 * 1.5 * 4.0) ** (1 / 3)
    assert geo[0, [0, 1, 3, 4, 5]].tolist() == pytest.approx([1.0, 1.0, turn1_geo, turn1_geo, turn1_geo])
    assert mean[0, [0, 1, 3, 4, 5]].tolist() == pytest.approx([1.25, 1.25, 7 / 3, 7 / 3, 7 / 3])
    assert geo[0, 2] == 0 and mean[0, 6] == 0  # off any turn


def test_the_turn_level_loss_clips_turns_and_adds_the_ctn_term():
    old = torch.zeros_like(LOG_R)
    adv = torch.tensor([[1.0, 1.0, 9.0, -1.0, -1.0, -1.0, 9.0]])
    s = ObjectiveSettings(clip_eps=0.2, clip_eps_high=0.2, dual_clip=None, ctn_kl_cap=None)
    terms = policy_objective(LOG_R, old, adv, MASK, turn_level=True, ctn_coef=8.0, settings=s)
    # turn 0: w̄ = 1 inside → J = 1 per token; turn 1: w̄ ≈ 2.08 with A = −1 → min(−2.08, −1.2) = −2.08
    w1 = (1.5 * 1.5 * 4.0) ** (1 / 3)
    assert terms.pg_loss.item() == pytest.approx(-(2 * 1.0 - 3 * w1) / 5)
    assert terms.clip_frac.item() == pytest.approx(3 / 5)  # turn 1's three tokens lie outside [0.8, 1.2]
    k3 = [r - 1 - math.log(r) for r in (2.0, 0.5, 1.5, 1.5, 4.0)]
    assert terms.ctn_penalty.item() == pytest.approx(8.0 * 3 / 5 * sum(k3) / 5)


def test_dual_clip_bounds_a_negative_advantage_at_c_times_a():
    ratio_log = torch.log(torch.tensor([[5.0, 5.0, 0.5]]))
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    s = ObjectiveSettings(dual_clip=3.0)
    terms = policy_objective(ratio_log, torch.zeros(1, 3), adv, mask, turn_level=False, settings=s)
    # −5 capped at −3; +A at 5 clipped to 1.2; ratio 0.5 on A < 0: min(−0.5, −0.8) = −0.8
    assert terms.pg_loss.item() == pytest.approx(-(-3.0 + 1.2 - 0.8) / 3)
    assert terms.dual_clip_frac.item() == pytest.approx(1 / 3)


def test_rollout_weights_scale_each_tokens_surrogate():
    logp = torch.zeros(1, 2)
    terms = policy_objective(
        logp,
        logp,
        torch.tensor([[1.0, 2.0]]),
        torch.ones(1, 2),
        turn_level=False,
        weights=torch.tensor([[0.5, 2.0]]),
    )
    assert terms.pg_loss.item() == pytest.approx(-(0.5 + 4.0) / 2)


def test_capped_k3_continues_linearly_beyond_the_cap():
    x = torch.tensor([math.log(9.0)], requires_grad=True)
    value = kl_k3_capped(x, 3.0)
    value.backward()
    assert x.grad.item() == pytest.approx(2.0)  # c − 1
    assert value.item() == pytest.approx(3 - 1 - math.log(3) + 2 * (math.log(9) - math.log(3)))


def test_per_turn_group_advantage_judges_a_turn_against_episodes_that_reached_it():
    # one group of 3 episodes: rewards 1, 0, 1; episode 0 played 2 turns, the others 1
    turn_ids = torch.tensor([[0, 1], [0, -1], [0, -1]])
    adv = turn_group_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.long), turn_ids)
    std0 = math.sqrt(((1 - 2 / 3) ** 2 * 2 + (2 / 3) ** 2) / 3)
    assert adv[:, 0].tolist() == pytest.approx(
        [(1 / 3) / (std0 + 1e-6), (-2 / 3) / (std0 + 1e-6), (1 / 3) / (std0 + 1e-6)]
    )
    assert adv[0, 1].item() == 0.0  # alone at turn 1: no spread, no signal


def test_the_ctn_controller_doubles_and_halves_within_its_bounds():
    coef = AdaptiveCtnCoef(value=32.0, target=0.05, low=32.0, high=128.0)
    assert [coef.update(f) for f in (0.1, 0.1, 0.1, 0.05, 0.01)] == [64.0, 128.0, None, None, 64.0]


@pytest.mark.parametrize(("turn_level", "dual_clip"), [(False, None), (False, 3.0), (True, 3.0)])
def test_ctns_pull_share_is_its_part_of_the_losss_gradient_on_log_r(turn_level, dual_clip):
    """``ctn_pull_share`` against autograd: |∂L_CTN/∂log r_t| and |∂L_pg/∂log r_t| summed over agent tokens,
    token and turn level (with one advantage per turn, as SO-GRPO's), with and without dual-clip, on random
    ratios far enough out to clip and cap."""
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 12, generator=gen, dtype=torch.float64) * 3
    log_r = torch.randn(6, 12, generator=gen, dtype=torch.float64) * 0.6
    adv = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 12, generator=gen) > 0.2).double()
    if turn_level:  # one advantage per turn: the first token's
        turn_ids = turn_ids_from_mask(mask)
        first = torch.where(turn_ids >= 0, turn_ids, 0).clamp_max(11)
        adv = torch.gather(adv, 1, first) * mask
    s = ObjectiveSettings(dual_clip=dual_clip)
    pg_grad, ctn_grad = (torch.zeros_like(log_r) for _ in range(2))
    for part, grad in (("pg_loss", pg_grad), ("ctn_penalty", ctn_grad)):
        x = log_r.clone().requires_grad_(True)
        terms = policy_objective(old + x, old, adv, mask, turn_level=turn_level, ctn_coef=2.0, settings=s)
        getattr(terms, part).backward()
        grad.copy_(x.grad)
    expected = ctn_grad.abs().sum() / (ctn_grad.abs().sum() + pg_grad.abs().sum())
    assert 0.05 < expected < 0.95  # both terms pull
    assert terms.ctn_pull.item() == pytest.approx(expected.item(), rel=1e-9)
    ratio = surrogate_ratio(log_r, None, mask, turn_level)
    assert ctn_pull_share(ratio, adv, log_r, mask, torch.tensor(0.0), s).item() == 0.0  # CTN off: no pull
