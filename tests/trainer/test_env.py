"""The multi-turn search task: layout, rewards, determinism, tokenizer."""

from __future__ import annotations

import pytest
import torch

from sorl_monitor.trainer.env import OBS_LEN, TURN_LEN, SearchEnv, TaskConfig


def play_expert(env: SearchEnv, n: int, error_rate: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    questions = env.sample_questions(n, g)
    return questions, env.play(questions, env.expert(questions, error_rate, g))


def test_a_perfect_demonstrator_answers_every_question_with_one_search_per_hop():
    env = SearchEnv(TaskConfig(min_hops=1, max_hops=3))
    questions, episodes = play_expert(env, 256, error_rate=0.0)
    assert episodes.rewards.eq(1).all() and episodes.well_formed.all()
    torch.testing.assert_close(episodes.n_turns, questions.hops + 1)
    assert set(questions.hops.tolist()) == {1, 2, 3}


def test_the_answer_follows_the_knowledge_base_hop_by_hop():
    env = SearchEnv()
    questions, episodes = play_expert(env, 64, error_rate=0.0)
    v = env.vocab
    for i in range(8):
        entity = int(questions.start[i])
        for hop in range(int(questions.hops[i])):
            entity = int(env.kb[entity, int(questions.relations[i, hop])])
        assert entity == int(questions.answer[i])
        words = v.decode(episodes.tokens[i]).split()
        answer_at = env.turn_start(int(questions.hops[i]))
        assert words[answer_at : answer_at + TURN_LEN] == ["<answer>", f"e{entity}", "</answer>", "<eos>"]


def test_observations_are_masked_out_and_turn_ids_mark_agent_tokens():
    env = SearchEnv()
    _, episodes = play_expert(env, 32, error_rate=0.5)
    for turn in range(env.config.max_turns):
        start = env.turn_start(turn)
        played = episodes.n_turns > turn
        assert episodes.mask[played, start : start + TURN_LEN].eq(1).all()
        assert episodes.turn_ids[played, start : start + TURN_LEN].eq(turn).all()
        if turn + 1 < env.config.max_turns:
            assert episodes.mask[:, start + TURN_LEN : start + TURN_LEN + OBS_LEN].eq(0).all()
    assert episodes.mask[:, : env.prompt_len].eq(0).all()
    assert (episodes.turn_ids >= 0).eq(episodes.mask.bool()).all()


def test_mistakes_lower_the_reward_and_a_malformed_turn_ends_the_episode_with_zero():
    env = SearchEnv()
    _, noisy = play_expert(env, 512, error_rate=1.0)
    assert (
        noisy.rewards.mean() < 0.1
    )  # a wrong entity in the chain gives a wrong answer (but for KB collisions)
    questions = env.sample_questions(4, torch.Generator().manual_seed(0))
    junk = lambda tokens, turn: (torch.full((4, TURN_LEN), env.vocab.info), None)  # noqa: E731
    episodes = env.play(questions, junk)
    assert episodes.rewards.eq(0).all() and not episodes.well_formed.any()
    assert episodes.n_turns.eq(1).all()


def test_questions_are_deterministic_from_the_seed_and_groups_repeat_a_prompt():
    env = SearchEnv()
    a = env.sample_questions(16, torch.Generator().manual_seed(3), group_size=4)
    b = env.sample_questions(16, torch.Generator().manual_seed(3), group_size=4)
    assert torch.equal(a.prompts, b.prompts)
    assert torch.equal(a.prompts[0], a.prompts[3]) and not torch.equal(a.prompts[0], a.prompts[4])
    assert torch.equal(SearchEnv().kb, env.kb)
    assert not torch.equal(SearchEnv(TaskConfig(kb_seed=1)).kb, env.kb)


def test_distractors_lengthen_the_prompt_and_bad_knobs_are_refused():
    env = SearchEnv(TaskConfig(distractors=3))
    assert env.prompt_len == SearchEnv().prompt_len + 3
    _, episodes = play_expert(env, 16, 0.0)
    assert episodes.rewards.eq(1).all()
    with pytest.raises(ValueError, match="max_turns"):
        SearchEnv(TaskConfig(max_hops=3, max_turns=3))
    with pytest.raises(ValueError, match="hops"):
        SearchEnv(TaskConfig(min_hops=2, max_hops=1))


def test_the_tokenizer_is_built_in_code_and_round_trips():
    env = SearchEnv()
    tokenizer = env.vocab.hf_tokenizer()
    text = "<bos> e3 r1 <nil> <nil> <search> e3 r1 </search>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == env.vocab.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.pad_token_id == env.vocab.pad
