"""Loss math of the bundled trainer's algorithms, against plain references written here."""

from __future__ import annotations

import math

import pytest
import torch

from sorl_monitor.remedy.objective import ctn_penalty, group_normalize
from sorl_monitor.trainer.algorithms import ALGORITHMS, get_algorithm
from sorl_monitor.trainer.algorithms.advantages import gae, turn_advantage
from sorl_monitor.trainer.algorithms.minibatch_loss import LossSettings, Minibatch, ratios
from sorl_monitor.trainer.policy import PolicyOutput
from sorl_monitor.write.metrics import masked_mean

# two episodes: turns of 2 agent tokens separated by 1 observation token, then padding
MASK = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1, 1], [0, 1, 1, 0, 1, 1, 0, 0, 0]], dtype=torch.float32)
TURNS = torch.tensor([[-1, 0, 0, -1, 1, 1, -1, 2, 2], [-1, 0, 0, -1, 1, 1, -1, -1, -1]])


def minibatch(
    logp: torch.Tensor, advantages: torch.Tensor, old_logp: torch.Tensor | None = None
) -> Minibatch:
    zeros = torch.zeros_like(logp)
    old = logp.detach() if old_logp is None else old_logp
    return Minibatch(MASK, TURNS, old, zeros, advantages, zeros, zeros)


def output(logp: torch.Tensor) -> PolicyOutput:
    return PolicyOutput(logp, torch.zeros_like(logp), torch.zeros_like(logp, requires_grad=True))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_at_ratio_one_every_surrogate_is_the_plain_policy_gradient(name):
    torch.manual_seed(0)
    algo = get_algorithm(name)
    logp = (-torch.rand(MASK.shape)).requires_grad_()
    # an advantage constant within each turn, as the turn-level algorithms produce
    per_turn = torch.randn(2, 9)
    adv = per_turn.gather(1, TURNS.clamp_min(0)) * MASK
    terms = algo.loss(output(logp), minibatch(logp, adv), LossSettings(), ctn_coef=1.0)
    (grad,) = torch.autograd.grad(terms.loss, logp)
    reference = -masked_mean(adv * logp, MASK)  # REINFORCE with the same advantages
    (expected,) = torch.autograd.grad(reference, logp)
    torch.testing.assert_close(grad, expected)
    assert float(terms.ctn_penalty) == 0.0  # nothing clipped at ratio 1: CTN adds nothing


def test_turn_ratio_is_the_masked_mean_or_geometric_mean_per_turn():
    old = torch.zeros(2, 9)
    logp = torch.tensor([[0, 0.1, 0.3, 5, -0.2, 0.0, 9, 0.5, -0.5], [0, 1.0, -1.0, 3, 0.2, 0.2, 0, 0, 0]])
    batch = minibatch(logp, torch.zeros(2, 9), old)
    _, mean_ratio = ratios(logp, batch, turn_level=True, mode="mean")
    _, geo_ratio = ratios(logp, batch, turn_level=True, mode="geomean")
    for row in range(2):
        for turn in range(3):
            cols = (TURNS[row] == turn).nonzero().flatten()
            if len(cols) == 0:
                continue
            r = logp[row, cols].exp()
            torch.testing.assert_close(mean_ratio[row, cols], r.mean().expand(len(cols)))
            torch.testing.assert_close(geo_ratio[row, cols], r.log().mean().exp().expand(len(cols)))
    assert float(mean_ratio[1, 7]) == 0.0  # padding gets no ratio


def test_ctn_penalty_is_zero_without_clipping_and_grows_with_the_clip_fraction():
    settings = LossSettings(clip_eps=0.2, clip_eps_high=0.2, ctn_kl_cap=None)  # plain k3 (the cap: below)
    mask = torch.ones(1, 10)
    penalties = []
    for n_clipped in range(0, 11, 2):
        log_ratio = torch.zeros(1, 10)
        log_ratio[0, :n_clipped] = 0.5  # r = 1.65, outside [0.8, 1.2]
        penalty, frac = ctn_penalty(log_ratio, log_ratio.exp(), mask, coef=1.0, s=settings)
        assert float(frac) == pytest.approx(n_clipped / 10)
        penalties.append(float(penalty))
    assert penalties[0] == 0.0
    assert all(b > a for a, b in zip(penalties, penalties[1:], strict=False))
    # the KL is k3 = r − 1 − log r on behaviour samples: bounded below by 0, finite for large log-ratios
    log_ratio = torch.full((1, 10), -30.0)
    penalty, _ = ctn_penalty(log_ratio, log_ratio.exp(), mask, coef=1.0, s=settings)
    assert float(penalty) == pytest.approx(29.0, rel=1e-4)


def test_ctn_with_the_proximal_anchor_pulls_back_to_the_learner_as_the_batch_began_not_to_pi_old():
    torch.manual_seed(0)
    old = torch.zeros(2, 9)
    logp = torch.full((2, 9), 0.5)  # r = 1.65 against π_old: every token clipped
    clipped = minibatch(logp, torch.zeros(2, 9), old)
    algo = get_algorithm("so_ppo")
    behaviour = algo.loss(output(logp), clipped, LossSettings(), ctn_coef=1.0)
    proximal = LossSettings(ctn_anchor="proximal")
    clipped.prox_logp = logp.clone()  # the learner has not moved since the batch began
    still = algo.loss(output(logp), clipped, proximal, ctn_coef=1.0)
    clipped.prox_logp = torch.full((2, 9), 0.2)
    moved = algo.loss(output(logp), clipped, proximal, ctn_coef=1.0)

    k3 = lambda x: x.exp() - 1 - x  # noqa: E731
    assert float(behaviour.clip_frac) == float(still.clip_frac) == 1.0  # clipping is judged against π_old
    assert float(behaviour.ctn_penalty) == pytest.approx(float(k3(torch.tensor(0.5))))
    assert float(still.ctn_penalty) == 0.0
    assert float(moved.ctn_penalty) == pytest.approx(float(k3(torch.tensor(0.3))))
    clipped.prox_logp = None  # asked for the proximal anchor without its log-probs: an error, not a fallback
    with pytest.raises(ValueError, match="prox_logp"):
        algo.loss(output(logp), clipped, proximal, ctn_coef=1.0)


def test_ctn_proximal_clip_level_counts_only_the_drift_since_the_batch_began():
    old = torch.zeros(2, 9)
    logp = torch.full((2, 9), 0.5)  # r = 1.65 against π_old: every token outside the trust region
    batch = minibatch(logp, torch.zeros(2, 9), old)
    algo, settings = get_algorithm("ppo"), LossSettings(ctn_clip_level="proximal", ctn_anchor="proximal")
    batch.prox_logp = logp.clone()  # the learner has not moved since the batch began
    assert float(algo.loss(output(logp), batch, settings, ctn_coef=1.0).clip_frac) == 0.0
    prox = torch.full((2, 9), 0.5)
    prox[0, 1:3] = 0.0  # 2 of the 10 agent tokens (MASK) moved by e^0.5 since the batch began, the rest not
    batch.prox_logp = prox
    terms = algo.loss(output(logp), batch, settings, ctn_coef=1.0)
    assert float(terms.clip_frac) == pytest.approx(2 / 10)
    k3 = float(torch.tensor(0.5).exp() - 1 - 0.5)
    assert float(terms.ctn_penalty) == pytest.approx(2 / 10 * k3 * 2 / 10)  # λ · frac · mean_t k3
    batch.prox_logp = None
    with pytest.raises(ValueError, match="prox_logp"):
        algo.loss(output(logp), batch, LossSettings(ctn_clip_level="proximal"), ctn_coef=1.0)


def test_grpo_advantage_is_normalized_within_each_prompt_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    mask = torch.ones(8, 3)
    turn_ids = torch.zeros(8, 3, dtype=torch.long)
    adv, _ = get_algorithm("grpo").advantages(
        rewards, torch.zeros(8, 3), mask, turn_ids, groups, LossSettings()
    )
    for g in (0, 1):
        r = rewards[groups == g]
        expected = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
        torch.testing.assert_close(adv[groups == g, 0], expected)
    # a group whose rewards are all equal has no signal
    flat, _ = get_algorithm("grpo").advantages(
        torch.ones(8), torch.zeros(8, 3), mask, turn_ids, groups, LossSettings()
    )
    assert flat.abs().max() == 0


def test_so_grpo_normalizes_per_turn_over_the_group_episodes_that_reached_the_turn():
    # one group of 4: episodes 0,1 play 1 turn (reward 0, 1); episodes 2,3 play 2 turns (reward 1, 1)
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0])
    turn_ids = torch.tensor([[0, -1, -1], [0, -1, -1], [0, -1, 1], [0, -1, 1]])
    mask = (turn_ids >= 0).float()
    adv, _ = get_algorithm("so_grpo").advantages(
        rewards, torch.zeros(4, 3), mask, turn_ids, torch.zeros(4, dtype=torch.long), LossSettings()
    )
    first = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
    torch.testing.assert_close(adv[:, 0], first)  # turn 0: all four episodes
    torch.testing.assert_close(adv[2:, 2], torch.zeros(2))  # turn 1: only episodes 2, 3, both reward 1
    assert adv[:2, 2].abs().sum() == 0  # turns not played get nothing


def test_gae_matches_a_per_token_loop_and_reduces_to_return_minus_value():
    torch.manual_seed(1)
    values = torch.randn(2, 9)
    rewards = torch.tensor([1.0, 0.5])
    gamma, lam = 0.9, 0.8
    got = gae(rewards, values, MASK, gamma, lam)
    for row in range(2):
        cols = MASK[row].nonzero().flatten().tolist()
        v = [float(values[row, c]) for c in cols] + [0.0]
        adv, running = [0.0] * len(cols), 0.0
        for j in reversed(range(len(cols))):
            r = float(rewards[row]) if j == len(cols) - 1 else 0.0
            running = r + gamma * v[j + 1] - v[j] + gamma * lam * running
            adv[j] = running
        torch.testing.assert_close(got[row, cols], torch.tensor(adv), rtol=1e-5, atol=1e-6)
    plain = gae(rewards, values, MASK, 1.0, 1.0)
    torch.testing.assert_close(plain, (rewards.unsqueeze(1) - values) * MASK)


def test_turn_advantage_uses_the_value_at_each_turn_start():
    values = torch.arange(18, dtype=torch.float32).view(2, 9)
    adv = turn_advantage(torch.tensor([1.0, 0.0]), values, MASK, TURNS, gamma=1.0)
    assert adv[0, 1] == adv[0, 2] == 1.0 - values[0, 1]
    assert adv[0, 4] == adv[0, 5] == 1.0 - values[0, 4]
    assert adv[1, 7] == 0.0


def test_group_normalize_ignores_invalid_entries():
    x = torch.tensor([1.0, 3.0, 100.0])
    out = group_normalize(x, torch.zeros(3, dtype=torch.long), torch.tensor([True, True, False]))
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 0.0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_gradient_reaches_the_policy_and_only_critic_algorithms_train_the_value_head(name):
    from sorl_monitor.trainer.env import SearchEnv
    from sorl_monitor.trainer.policy import PolicyWithValue

    torch.manual_seed(0)
    env = SearchEnv()
    policy = PolicyWithValue(len(env.vocab), env.seq_len)
    questions = env.sample_questions(8, torch.Generator().manual_seed(0), group_size=4)
    episodes = env.play(questions, env.expert(questions, 0.5, torch.Generator().manual_seed(1)))
    algo = get_algorithm(name)
    out = policy(episodes.tokens, with_values=algo.critic)
    mask = episodes.mask.float()
    adv, returns = algo.advantages(episodes.rewards, out.values.detach(), mask, episodes.turn_ids,
                                   torch.arange(8) // 4, LossSettings())  # fmt: skip
    old = out.logp.detach() - 0.3 * torch.rand_like(out.logp)  # off-policy: some ratios clip
    batch = Minibatch(mask, episodes.turn_ids, old, out.logp.detach(), adv, returns, out.values.detach())
    algo.loss(out, batch, LossSettings(), ctn_coef=1.0).loss.backward()
    lm_grad = sum(p.grad.abs().sum() for p in policy.lm.parameters() if p.grad is not None)
    assert lm_grad > 0
    head_grad = policy.value_head.weight.grad
    if algo.critic:
        assert head_grad is not None and head_grad.abs().sum() > 0
    else:
        assert head_grad is None


def verl_style_dual_clip(ratio, adv, eps_low, eps_high, c):
    """Per-token loss with dual-clip as verl documents it (``clip_ratio_c``), written out here:
    L1 = max(−A ρ, −A clip(ρ)); where A < 0: min(L1, −A c); mean over the mask."""
    loss_1 = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    loss_2 = torch.minimum(loss_1, -adv * c)
    return masked_mean(torch.where(adv < 0, loss_2, loss_1), MASK)


@pytest.mark.parametrize("c", [1.5, 3.0, 10.0])
def test_dual_clip_equals_the_verl_formula_on_hand_made_ratios(c):
    from sorl_monitor.remedy.objective import clipped_surrogate

    # ratios far above and below the trust region, with both signs of advantage
    ratio = torch.tensor(
        [[1.0, 0.5, 4.0, 1.0, 20.0, 1.1, 1.0, 0.9, 400.0], [1.0, 2.5, 0.1, 1.0, 1.3, 7.0, 1, 1, 1]]
    )
    adv = torch.tensor(
        [[0.0, -1.0, -2.0, 0.0, -0.5, 1.0, 0.0, 2.0, -1.0], [0.0, 1.0, -3.0, 0.0, -1.0, -1.0, 0, 0, 0]]
    )
    ours = clipped_surrogate(ratio, adv, MASK, 0.2, 0.28, dual_clip=c)
    torch.testing.assert_close(ours, verl_style_dual_clip(ratio, adv, 0.2, 0.28, c))
    plain = clipped_surrogate(ratio, adv, MASK, 0.2, 0.28)
    assert float(plain) > float(ours)  # the 400× and 20× tokens on negative advantages no longer dominate


@pytest.mark.parametrize("name", ["ppo", "so_ppo", "grpo"])
def test_at_ratio_one_dual_clip_and_token_level_ctn_leave_the_plain_policy_gradient(name):
    torch.manual_seed(1)
    logp = (-torch.rand(MASK.shape)).requires_grad_()
    adv = torch.randn(2, 9).gather(1, TURNS.clamp_min(0)) * MASK
    settings = LossSettings(dual_clip=3.0, ctn_clip_level="token")
    terms = get_algorithm(name).loss(output(logp), minibatch(logp, adv), settings, ctn_coef=4.0)
    (grad,) = torch.autograd.grad(terms.loss, logp)
    (expected,) = torch.autograd.grad(-masked_mean(adv * logp, MASK), logp)
    torch.testing.assert_close(grad, expected)


def test_token_level_ctn_multiplies_the_token_clip_fraction_even_for_a_turn_ratio():
    old = torch.zeros(2, 9)
    # turn 0 of row 0: token ratios e^1 and e^-1 average to 1.54 (clipped as a turn); all other tokens at 1
    logp = torch.zeros(2, 9)
    logp[0, 1], logp[0, 2] = 1.0, -1.0
    batch = minibatch(logp, torch.zeros(2, 9), old)
    algo = get_algorithm("so_ppo")
    surrogate = algo.loss(output(logp), batch, LossSettings(turn_ratio="mean"), ctn_coef=1.0)
    token = algo.loss(
        output(logp), batch, LossSettings(turn_ratio="mean", ctn_clip_level="token"), ctn_coef=1.0
    )
    assert float(surrogate.clip_frac) == pytest.approx(2 / 10)  # the turn's 2 tokens, of 10 agent tokens
    assert float(token.clip_frac) == pytest.approx(2 / 10)
    logp[0, 2] = 0.1  # now the turn mean is (e + e^0.1)/2 = 1.91: still clipped; token 2 inside alone
    batch = minibatch(logp, torch.zeros(2, 9), old)
    assert float(
        algo.loss(output(logp), batch, LossSettings(turn_ratio="mean"), 1.0).clip_frac
    ) == pytest.approx(2 / 10)
    token = algo.loss(output(logp), batch, LossSettings(turn_ratio="mean", ctn_clip_level="token"), 1.0)
    assert float(token.clip_frac) == pytest.approx(1 / 10)


def test_capped_k3_is_k3_inside_the_cap_and_its_gradient_is_bounded_outside():
    from sorl_monitor.remedy.objective import kl_k3_capped
    from sorl_monitor.write.metrics import kl_k3

    cap = 3.0
    inside = torch.linspace(-1.0, 1.0, 9)  # |log r| ≤ log 3 ≈ 1.10
    assert torch.allclose(kl_k3_capped(inside, cap), kl_k3(inside))
    assert torch.equal(kl_k3_capped(inside, None), kl_k3(inside))
    x = torch.tensor([-6.0, -2.0, 2.0, 6.0], requires_grad=True)
    kl_k3_capped(x, cap).sum().backward()
    assert torch.allclose(x.grad, torch.tensor([1 / cap - 1, 1 / cap - 1, cap - 1, cap - 1]))
    # continuous at the cap, and ≥ 0 everywhere (like k3)
    edge = torch.tensor([math.log(cap) - 1e-4, math.log(cap) + 1e-4])
    below, above = kl_k3_capped(edge, cap)
    assert abs(float(above - below)) < 1e-3
    assert (kl_k3_capped(torch.linspace(-8, 8, 101), cap) >= 0).all()
