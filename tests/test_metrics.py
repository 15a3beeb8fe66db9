"""``sorl_monitor.write.metrics`` agrees with a naive per-token reference on awkward random batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sorl_monitor.write import metrics as M
from sorl_monitor.write.update_metrics import update_metrics

EPS = 0.2


# ----------------------------------------------------------------------------- naive reference
def reference_turns(mask: list[int]) -> list[list[int]]:
    """Token positions of each contiguous run of policy tokens, by walking the row."""
    turns, current = [], []
    for t, m in enumerate(mask):
        if m:
            current.append(t)
        elif current:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return turns


def reference_update(logp, old_logp, mask, adv, values, rewards, groups):
    """Every step metric computed token by token in plain Python (the specification)."""
    B, T = logp.shape
    ratios, log_ratios, kl1, kl3, advs, vals, row_geo = [], [], [], [], [], [], []
    nonfinite = 0
    turn_means, turn_clipped, turn_sums = [], [], []
    lengths, turns_per_row = [], []
    per_turn_rows = []
    for b in range(B):
        row_mask = [int(mask[b, t]) for t in range(T)]
        lengths.append(sum(row_mask))
        finite = [
            math.isfinite(logp[b, t]) and math.isfinite(old_logp[b, t]) and math.isfinite(values[b, t])
            for t in range(T)
        ]
        nonfinite += sum(1 for t in range(T) if row_mask[t] and not finite[t])
        valid = [row_mask[t] and finite[t] for t in range(T)]
        row_logs = []
        for t in range(T):
            if valid[t]:
                x = logp[b, t] - old_logp[b, t]
                log_ratios.append(x)
                ratios.append(math.exp(x))
                kl1.append(-x)
                kl3.append(math.exp(x) - 1 - x)
                advs.append(adv[b])
                vals.append(values[b, t])
                row_logs.append(x)
        if row_logs:
            row_geo.append(math.exp(sum(row_logs) / len(row_logs)))
        turns = [[t for t in turn if valid[t]] for turn in reference_turns(row_mask)]
        # a turn whose tokens are all non-finite is no turn; the others keep their index
        kept = 0
        for k, turn in enumerate(turns):
            if not turn:
                continue
            kept += 1
            rs = [math.exp(logp[b, t] - old_logp[b, t]) for t in turn]
            w = sum(rs) / len(rs)
            turn_means.append(w)
            turn_clipped.append(w < 1 - EPS or w > 1 + EPS)
            s = sum(logp[b, t] - old_logp[b, t] for t in turn)
            turn_sums.append(s)
            per_turn_rows.append((b, k, len(turn), w, s, max(rs), min(rs), values[b, turn[0]]))
        turns_per_row.append(kept)
    n = len(ratios)

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    def std(xs):
        if not xs:
            return float("nan")
        m = mean(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))

    group_std, zero = {}, []
    for g in sorted(set(groups)):
        rs = [rewards[i] for i in range(B) if groups[i] == g]
        group_std[g] = std(rs)
        if len(rs) >= 2:
            zero.append(float(group_std[g] <= 1e-8))
    return {
        "ratio_mean": mean(ratios),
        "ratio_min": min(ratios) if ratios else float("nan"),
        "ratio_max": max(ratios) if ratios else float("nan"),
        "log_ratio_std": std(log_ratios),
        "clip_frac": mean([float(r < 1 - EPS or r > 1 + EPS) for r in ratios]),
        "clip_frac_low": mean([float(r < 1 - EPS) for r in ratios]),
        "clip_frac_high": mean([float(r > 1 + EPS) for r in ratios]),
        "clip_frac_active": mean(
            [
                float((r < 1 - EPS and a < 0) or (r > 1 + EPS and a > 0))
                for r, a in zip(ratios, advs, strict=True)
            ]
        ),
        "kl_old_k1": mean(kl1),
        "kl_old_k2": mean([x * x / 2 for x in log_ratios]),
        "kl_old_k3": mean(kl3),
        "seq_ratio_mean": mean(row_geo),
        "turn_ratio_mean": mean(turn_means),
        "turn_ratio_max": max(turn_means) if turn_means else float("nan"),
        "clip_frac_turn": mean([float(c) for c in turn_clipped]),
        "turn_log_ratio_sum_max": max(abs(s) for s in turn_sums) if turn_sums else float("nan"),
        "adv_mean": mean(advs),
        "value_mean": mean(vals),
        "value_std": std(vals),
        "reward_mean": mean(list(rewards)),
        "reward_std": std(list(rewards)),
        "group_reward_std": mean(list(group_std.values())),
        "zero_std_group_frac": mean(zero),
        "nonfinite_count": float(nonfinite),
        "response_len_mean": mean(lengths),
        "turns_mean": mean(turns_per_row),
        "n_tokens": float(n),
    }, per_turn_rows


# ----------------------------------------------------------------------------- awkward batches
def awkward_batch(seed: int, extreme: bool = False, nonfinite: bool = False):
    """Random batch with padding, single-token turns, an empty row and optional ±50 or NaN/Inf inputs."""
    g = torch.Generator().manual_seed(seed)
    B, T = 7, 23
    mask = (torch.rand(B, T, generator=g) > 0.45).long()
    mask[0] = 0  # an empty (all-masked) row
    mask[1] = torch.tensor([1, 0] * 11 + [1])  # single-token turns
    mask[2, 15:] = 0  # right padding
    mask[3] = 1  # one turn spanning the row
    logp = -torch.rand(B, T, generator=g) * 3
    old_logp = logp + torch.randn(B, T, generator=g) * 0.4
    if extreme:
        old_logp[4, ::3] = logp[4, ::3] - 50.0
        old_logp[5, ::4] = logp[5, ::4] + 50.0
    values = torch.randn(B, T, generator=g)
    if nonfinite:
        logp[2, 3] = float("nan")
        old_logp[3, 5] = float("inf")
        values[6, :4] = float("-inf")
        logp[4, 0] = float("nan")  # may sit on a masked token: then it is not counted
    adv = torch.randn(B, generator=g)
    rewards = (torch.rand(B, generator=g) > 0.5).double()
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    rewards[2:5] = 1.0  # group 1 has zero reward std
    return logp.double(), old_logp.double(), mask, adv.double(), values.double(), rewards, groups


def reference_of(logp, old_logp, mask, adv, values, rewards, groups):
    """``reference_update`` of a batch of tensors (numpy arrays and lists, as the reference takes them)."""
    arrays = (t.numpy() for t in (logp, old_logp, mask, adv, values))
    return reference_update(*arrays, rewards.tolist(), groups.tolist())


@pytest.mark.parametrize(
    ("seed", "extreme", "nonfinite"),
    [(0, False, False), (1, False, False), (2, True, False), (3, False, True), (4, True, True)],
)
def test_update_metrics_match_naive_reference(seed, extreme, nonfinite):
    logp, old_logp, mask, adv, values, rewards, groups = awkward_batch(seed, extreme, nonfinite)
    got = update_metrics(
        logp, old_logp, mask, advantages=adv, values=values, rewards=rewards, group_ids=groups, clip_eps=EPS
    )
    expected, _ = reference_of(logp, old_logp, mask, adv, values, rewards, groups)
    for name, value in expected.items():
        actual = float(got.scalars[name])
        assert math.isfinite(actual) == math.isfinite(value), name
        if math.isfinite(value):
            assert actual == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_per_turn_rows_match_naive_reference():
    logp, old_logp, mask, adv, values, rewards, groups = awkward_batch(5, nonfinite=True)
    got = update_metrics(logp, old_logp, mask, advantages=adv, values=values, rewards=rewards, clip_eps=EPS)
    _, rows = reference_of(logp, old_logp, mask, adv, values, rewards, groups)
    valid = got.turn_valid.numpy()
    assert valid.sum() == len(rows)
    for b, k, n, w, s, rmax, rmin, v0 in rows:
        assert valid[b, k]
        assert got.turns["n_tokens"][b, k] == n
        assert float(got.turns["ratio_mean"][b, k]) == pytest.approx(w, rel=1e-9)
        assert float(got.turns["log_ratio_sum"][b, k]) == pytest.approx(s, rel=1e-9, abs=1e-12)
        assert float(got.turns["ratio_max"][b, k]) == pytest.approx(rmax, rel=1e-9)
        assert float(got.turns["ratio_min"][b, k]) == pytest.approx(rmin, rel=1e-9)
        assert float(got.turns["value"][b, k]) == pytest.approx(v0, rel=1e-9)


def test_per_turn_means_match_a_token_by_token_walk():
    """The turn table's mean columns (clip fraction, advantage, k3, entropy) and reward, turn by turn."""
    logp, old_logp, mask, adv, values, rewards, _ = awkward_batch(6, extreme=True)
    entropy = torch.rand(logp.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    adv_tokens = adv[:, None] + torch.linspace(0, 1, logp.shape[1], dtype=torch.float64)  # differs per token
    got = update_metrics(logp, old_logp, mask, advantages=adv_tokens, entropy=entropy, rewards=rewards,
                         clip_eps=EPS)  # fmt: skip
    turns, valid = got.turns, got.turn_valid
    checked = 0
    for b in range(logp.shape[0]):
        for k, positions in enumerate(reference_turns(mask[b].tolist())):
            assert valid[b, k]
            xs = [float(logp[b, t] - old_logp[b, t]) for t in positions]
            expected = {
                "clip_frac": sum(abs(math.exp(x) - 1) > EPS for x in xs) / len(xs),
                "advantage": sum(float(adv_tokens[b, t]) for t in positions) / len(xs),
                "kl_k3": sum(math.exp(x) - 1 - x for x in xs) / len(xs),
                "entropy": sum(float(entropy[b, t]) for t in positions) / len(xs),
                "reward": float(rewards[b]),
            }
            for name, value in expected.items():
                assert float(turns[name][b, k]) == pytest.approx(value, rel=1e-9, abs=1e-12), (b, k, name)
            checked += 1
    assert checked == int(valid.sum()) > 10


def test_stacked_reductions_match_each_row_reduced_alone():
    """``masked_means``, ``masked_extremes``, ``turn_sums`` and ``turn_mins`` give each stacked row what reducing
    its selected entries alone gives."""
    logp, old_logp, mask, adv, values, *_ = awkward_batch(7, nonfinite=True)
    valid = mask.bool() & logp.isfinite() & values.isfinite()
    stack = torch.stack((logp, values, adv[:, None].expand_as(logp)))
    filled = torch.where(valid, stack, 0.0)  # masked_means takes finite values everywhere
    mean = M.masked_means(filled, valid)
    std = M.masked_means((filled - mean[:, None, None]) ** 2, valid).sqrt()
    low, high = M.masked_extremes(stack, valid)
    for q, x in enumerate(stack):
        assert float(mean[q]) == pytest.approx(float(M.masked_mean(x, valid)), rel=1e-12)
        picked = x[valid]
        assert float(std[q]) == pytest.approx(float(picked.std(correction=0)), rel=1e-12)
        assert float(low[q]) == float(picked.min()) and float(high[q]) == float(picked.max())
    turn_ids = M.turn_ids_from_mask(mask)
    in_turn = valid & (turn_ids >= 0)
    index = M.turn_index(turn_ids)
    sums, mins = M.turn_sums(stack, index, in_turn), M.turn_mins(stack, index, in_turn)
    for q, x in enumerate(stack):
        for b in range(stack.shape[1]):
            for k in range(int(turn_ids[b].max()) + 1):
                picked = x[b][(turn_ids[b] == k) & in_turn[b]]
                assert float(sums[q, b, k]) == pytest.approx(float(picked.sum()), rel=1e-12, abs=1e-15)
    for b in range(stack.shape[1]):
        for k in range(int(turn_ids[b].max()) + 1):
            positions = [t for t in range(stack.shape[2]) if turn_ids[b, t] == k and in_turn[b, t]]
            if not positions:
                assert torch.isinf(mins[:, b, k]).all()
                continue
            assert [float(mins[q, b, k]) for q in range(3)] == [
                min(float(x[b, t]) for t in positions) for x in stack
            ]
    assert torch.isinf(mins[:, 0]).all()  # row 0 has no turn: its slots stay at +inf
    nothing = torch.zeros_like(valid)
    assert all(
        torch.isnan(stat).all()
        for stat in (M.masked_means(filled, nothing), *M.masked_extremes(stack, nothing))
    )


def test_nonfinite_inputs_are_counted_and_do_not_propagate():
    logp, old_logp, mask, adv, values, rewards, groups = awkward_batch(3, nonfinite=True)
    got = update_metrics(
        logp, old_logp, mask, advantages=adv, values=values, rewards=rewards, group_ids=groups
    )
    assert got.scalars["nonfinite_count"] > 0
    for name, value in got.scalars.items():
        assert math.isfinite(float(value)), name


def test_all_masked_batch_gives_nan_statistics_not_errors():
    B, T = 3, 5
    zeros = torch.zeros(B, T)
    got = update_metrics(zeros, zeros, torch.zeros(B, T, dtype=torch.long))
    assert math.isnan(float(got.scalars["ratio_mean"]))
    assert math.isnan(float(got.scalars["turn_ratio_max"]))
    assert float(got.scalars["n_tokens"]) == 0
    assert not got.turn_valid.any()


def test_turn_ids_from_mask_numbers_contiguous_runs():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0]])
    expected = [[-1, 0, 0, -1, -1, 1, -1, 2], [0, 0, 0, 0, -1, -1, -1, -1]]
    assert M.turn_ids_from_mask(mask).tolist() == expected
    for b in range(2):
        runs = reference_turns(mask[b].tolist())
        for k, positions in enumerate(runs):
            assert all(M.turn_ids_from_mask(mask)[b, t] == k for t in positions)


@pytest.mark.parametrize("mode", ["mean", "geomean"])
def test_turn_ratio_is_the_per_turn_mean_broadcast_to_its_tokens(mode):
    g = torch.Generator().manual_seed(11)
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 0, 1]])
    log_ratio = torch.randn(1, 9, generator=g, dtype=torch.float64) * 0.3
    turn_ids = M.turn_ids_from_mask(mask)
    got = M.turn_ratio(log_ratio, turn_ids, mode=mode)[0]
    for positions in reference_turns(mask[0].tolist()):
        xs = [float(log_ratio[0, t]) for t in positions]
        w = sum(math.exp(x) for x in xs) / len(xs) if mode == "mean" else math.exp(sum(xs) / len(xs))
        for t in positions:
            assert float(got[t]) == pytest.approx(w, rel=1e-12)
    assert float(got[0]) == 0.0 and float(got[4]) == 0.0


def test_turn_ratio_is_differentiable_with_mean_token_gradients():
    mask = torch.tensor([[1, 1, 0, 1, 1, 1]])
    log_ratio = torch.tensor([[0.1, -0.2, 0.0, 0.3, 0.0, -0.1]], dtype=torch.float64, requires_grad=True)
    turn_ids = M.turn_ids_from_mask(mask)
    # one loss term per turn: d(w̄_k)/d(log r_t) = r_t / n_k
    per_token = M.turn_ratio(log_ratio, turn_ids)
    loss = per_token[0, 0] + per_token[0, 3]
    loss.backward()
    r = log_ratio.detach().exp()[0]
    expected = [r[0] / 2, r[1] / 2, 0.0, r[3] / 3, r[4] / 3, r[5] / 3]
    assert log_ratio.grad[0].tolist() == pytest.approx([float(e) for e in expected])


def test_turn_ratio_rejects_unknown_mode():
    with pytest.raises(ValueError, match="geomean"):
        M.turn_ratio(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long), mode="product")


def test_kl_estimators_match_their_formulas_and_k3_is_nonnegative():
    x = torch.linspace(-50, 50, 101, dtype=torch.float64)
    assert torch.equal(M.kl_k1(x), -x)
    assert torch.allclose(M.kl_k2(x), x**2 / 2)
    assert torch.allclose(M.kl_k3(x), x.exp() - 1 - x)
    assert (M.kl_k3(x) >= 0).all()


def test_kl_k3_mean_estimates_the_true_kl_on_behaviour_samples():
    # π_old = N-free categorical over 4 tokens; KL(π_old‖π_θ) from the definition vs k3 on samples
    g = torch.Generator().manual_seed(0)
    old = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    new = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    samples = torch.multinomial(old, 200_000, replacement=True, generator=g)
    x = new.log()[samples] - old.log()[samples]
    true_kl = float((old * (old.log() - new.log())).sum())
    assert float(M.kl_k3(x).mean()) == pytest.approx(true_kl, rel=0.02)
    assert float(M.kl_k1(x).mean()) == pytest.approx(true_kl, rel=0.05)


def test_entropy_from_logits_matches_definition():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    p = logits.softmax(-1)
    assert torch.allclose(M.entropy_from_logits(logits).double(), -(p * p.log()).sum(-1), atol=1e-6)


def test_group_reward_stats_with_sparse_group_ids():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([900, 900, 7, 7, 42])  # group 42 has one episode: no std signal
    stats = M.group_reward_stats(rewards, groups)
    assert float(stats["zero_std_frac"]) == pytest.approx(0.5)  # of the two groups with ≥ 2 episodes
    assert float(stats["std_mean"]) == pytest.approx((0.0 + 0.5 + 0.0) / 3)


def test_module_norms_match_per_parameter_norms():
    a, b, c = (torch.nn.Parameter(torch.randn(s)) for s in [(3, 4), (5,), (2, 2)])
    for p in (a, b):
        p.grad = torch.randn_like(p)
    grad, param = M.module_norms([[a, b], [c]])
    expected_grad = math.sqrt(float(a.grad.norm() ** 2 + b.grad.norm() ** 2))
    assert float(grad[0]) == pytest.approx(expected_grad, rel=1e-5)
    assert float(grad[1]) == 0.0  # c has no gradient
    assert float(param[1]) == pytest.approx(float(c.detach().norm()), rel=1e-5)


def test_module_norms_of_bf16_parameters_are_float32_and_take_a_prebuilt_index():
    """bf16 parameters: each norm is accumulated and kept in float32 (a bf16 result keeps 3 digits)."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.nn.Parameter(torch.randn(s, generator=g).bfloat16()) for s in [(64, 64), (333,), (7,)])
    a.grad = torch.randn(64, 64, generator=g).bfloat16()
    index = M.group_index([[a], [b, c]], a.device)
    assert index.tolist() == [0, 1, 1]
    grad, param = M.module_norms([[a], [b, c]], index)
    assert grad.dtype == param.dtype == torch.float32
    assert float(grad[0]) == pytest.approx(float(a.grad.double().norm()), rel=1e-6)
    assert float(grad[1]) == 0.0  # b and c have no gradient
    expected = math.sqrt(float(b.double().norm() ** 2 + c.double().norm() ** 2))
    assert float(param[1]) == pytest.approx(expected, rel=1e-6)


def test_clip_fraction_splits_low_and_high():
    ratio = torch.tensor([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 3.0, 9.0])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0])
    clip = M.clip_fraction(ratio, mask, 0.2, 0.2)
    assert float(clip["low"]) == pytest.approx(2 / 7)
    assert float(clip["high"]) == pytest.approx(2 / 7)
    assert float(clip["total"]) == pytest.approx(4 / 7)


def test_quantiles_use_only_selected_tokens():
    x = torch.arange(100, dtype=torch.float64).reshape(10, 10)
    mask = torch.zeros(10, 10, dtype=torch.bool)
    mask[:5] = True  # values 0..49
    low, high = M.masked_tails(x, mask, 0.01).tolist()
    assert (low, high) == pytest.approx(list(np.quantile(np.arange(50), [0.01, 0.99])))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 100, 101, 199, 1000])
def test_tails_are_torch_quantiles_of_the_selected_values(n):
    """Bit for bit ``torch.nanquantile`` of the selected values, whatever how many are selected (one process)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(8, 160, generator=g, dtype=torch.float64)
    mask = torch.zeros(8 * 160, dtype=torch.bool)
    mask[torch.randperm(8 * 160, generator=g)[:n]] = True
    mask = mask.view(8, 160)
    far = torch.rand(int((~mask).sum()), generator=g, dtype=torch.float64) > 0.5
    x[~mask] = torch.where(far, 1e9, -1e9).double()  # values off the mask are never ranked
    got = M.masked_tails(x, mask, 0.01)
    expected = torch.nanquantile(
        torch.where(mask, x, float("nan")).flatten(), torch.tensor([0.01, 0.99], dtype=torch.float64)
    )
    assert torch.equal(got, expected) or (n == 0 and torch.isnan(got).all() and torch.isnan(expected).all())


def test_update_metrics_stays_within_its_kernel_budget():
    """The call's fixed cost is its number of device operations (each a dispatch on the CPU, a launch on CUDA):
    counted, not timed, with every optional input given: 437 here, 822 before the quantities were stacked."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    logp, old_logp, mask, adv, values, rewards, groups = awkward_batch(8, nonfinite=True)
    inputs = dict(ref_logp=logp - 0.1, entropy=torch.rand_like(logp), advantages=adv, values=values,
                  returns=values + 1, rewards=rewards, group_ids=groups)  # fmt: skip
    with Count():
        update_metrics(logp, old_logp, mask, **inputs)
    assert 100 < Count.calls <= 500


def test_to_host_brings_scalar_tensors_back_as_floats_in_one_copy():
    values = {"a": torch.tensor(0.1, dtype=torch.float64), "b": torch.tensor([2.5]), "c": torch.tensor(3)}
    assert M.to_host(values) == {"a": 0.1, "b": 2.5, "c": 3.0}  # float64 keeps the value exactly
    assert M.to_host({}) == {}
