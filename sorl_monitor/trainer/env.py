"""A multi-turn, multi-hop search task over a generated knowledge base, batched on tensors.

The knowledge base maps ``(entity, relation) → entity``. A question names a start entity and a chain
of 1–3 relations; its answer is the entity at the end of the chain, so answering needs one search
per hop, each query built from the previous result::

    prompt   <bos> e12 r3 r0 <nil>                  start e12, follow r3 then r0
    turn 0   <search> e12 r3 </search>              agent (policy tokens, mask 1)
             <info> e41 </info>                     environment (observation tokens, mask 0)
    turn 1   <search> e41 r0 </search>
             <info> e7 </info>
    turn 2   <answer> e7 </answer> <eos>            reward 1 if e7 is the answer

Every turn is ``TURN_LEN`` agent tokens followed by ``OBS_LEN`` observation tokens, so turn ``k``
sits at fixed positions and a whole batch steps in lockstep: no per-episode Python code. A turn
that is neither a well-formed search nor a well-formed answer ends the episode with reward 0, as
does running out of turns. Deterministic from the seeds; knobs: hops, distractor entities in the
prompt, knowledge-base size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sorl_monitor.trainer.tokenizer import Vocab

TURN_LEN = 4
OBS_LEN = 3


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs of the search task."""

    n_entities: int = 60
    n_relations: int = 6
    min_hops: int = 1
    max_hops: int = 3
    distractors: int = 0
    """Random entity tokens appended to the prompt, which the agent must ignore."""
    max_turns: int = 4
    format_reward: float = 0.0
    """Added to the reward of an episode whose every turn is well formed."""
    kb_seed: int = 0

    def check(self) -> None:
        if self.n_entities < 2 or self.n_relations < 1:
            raise ValueError("the knowledge base needs at least 2 entities and 1 relation")
        if not 1 <= self.min_hops <= self.max_hops:
            raise ValueError(
                f"hops must satisfy 1 ≤ min_hops ≤ max_hops, got {self.min_hops}..{self.max_hops}"
            )
        if self.max_turns < self.max_hops + 1:
            raise ValueError(
                f"max_turns ({self.max_turns}) must be at least max_hops + 1 ({self.max_hops + 1})"
            )
        if self.distractors < 0:
            raise ValueError("distractors must be ≥ 0")


@dataclass
class Questions:
    prompts: Tensor  # (n, prompt_len) token ids
    start: Tensor  # (n,) entity index
    relations: Tensor  # (n, max_hops) relation index, −1 past the question's hops
    hops: Tensor  # (n,)
    answer: Tensor  # (n,) entity index


@dataclass
class Episodes:
    """A batch of played episodes: full token sequences and what the loss and the monitor need."""

    tokens: Tensor  # (n, T) prompt, agent turns, observations, padding
    mask: Tensor  # (n, T) 1 on agent tokens of turns that were played
    turn_ids: Tensor  # (n, T) turn index on agent tokens, −1 elsewhere
    rewards: Tensor  # (n,)
    correct: Tensor  # (n,) bool
    well_formed: Tensor  # (n,) bool, every played turn was a valid search or answer
    n_turns: Tensor  # (n,)
    logp: Tensor | None = None  # (n, T) behaviour log-probs of agent tokens (rollouts only)


Actor = Callable[[Tensor, int], tuple[Tensor, Tensor | None]]
"""``actor(tokens_so_far, turn) → (actions (n, TURN_LEN), logp (n, TURN_LEN) or None)``."""


class SearchEnv:
    """The task: a knowledge base, question sampling and the batched turn loop (see module docstring)."""

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config or TaskConfig()
        self.config.check()
        c = self.config
        self.vocab = Vocab(c.n_relations, c.n_entities)
        g = torch.Generator().manual_seed(c.kb_seed)
        # kb[e, r] is never e itself, so every hop moves
        offset = torch.randint(1, c.n_entities, (c.n_entities, c.n_relations), generator=g)
        self.kb = (torch.arange(c.n_entities).unsqueeze(1) + offset) % c.n_entities
        self.prompt_len = 2 + c.max_hops + c.distractors
        self.seq_len = self.prompt_len + c.max_turns * (TURN_LEN + OBS_LEN) - OBS_LEN

    def turn_start(self, turn: int) -> int:
        """Position of turn ``turn``'s first agent token."""
        return self.prompt_len + turn * (TURN_LEN + OBS_LEN)

    # ------------------------------------------------------------------ questions
    def sample_questions(self, n: int, generator: torch.Generator, group_size: int = 1) -> Questions:
        """``n`` questions; with ``group_size`` > 1 each question is repeated that many times (GRPO groups)."""
        c, v = self.config, self.vocab
        if n % group_size:
            raise ValueError(f"episodes ({n}) must be a multiple of the group size ({group_size})")
        m = n // group_size
        start = torch.randint(0, c.n_entities, (m,), generator=generator)
        hops = torch.randint(c.min_hops, c.max_hops + 1, (m,), generator=generator)
        relations = torch.randint(0, c.n_relations, (m, c.max_hops), generator=generator)
        used = torch.arange(c.max_hops).unsqueeze(0) < hops.unsqueeze(1)
        relations = torch.where(used, relations, torch.full_like(relations, -1))
        answer = start.clone()
        for hop in range(c.max_hops):  # ≤ 3 vectorised hops
            step = self.kb[answer, relations[:, hop].clamp_min(0)]
            answer = torch.where(used[:, hop], step, answer)
        prompt = [torch.full((m, 1), v.bos), (start + v.first_entity).unsqueeze(1),
                  torch.where(used, relations + v.first_relation, torch.full_like(relations, v.nil))]  # fmt: skip
        if c.distractors:
            prompt.append(
                torch.randint(0, c.n_entities, (m, c.distractors), generator=generator) + v.first_entity
            )
        prompts = torch.cat(prompt, dim=1)
        rep = lambda t: t.repeat_interleave(group_size, dim=0)  # noqa: E731
        return Questions(rep(prompts), rep(start), rep(relations), rep(hops), rep(answer))

    # ------------------------------------------------------------------ dynamics
    def respond(self, actions: Tensor, answer: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Judge one turn of actions ``(n, TURN_LEN)``: ``(observation, is_search, is_answer, correct)``."""
        v, c = self.vocab, self.config
        a0, a1, a2, a3 = actions.unbind(1)
        entity = a1 - v.first_entity
        relation = a2 - v.first_relation
        is_entity = (entity >= 0) & (entity < c.n_entities)
        is_search = (
            (a0 == v.search) & is_entity & (relation >= 0) & (relation < c.n_relations) & (a3 == v.search_end)
        )
        is_answer = (a0 == v.answer) & is_entity & (a2 == v.answer_end) & (a3 == v.eos)
        found = (
            self.kb[entity.clamp(0, c.n_entities - 1), relation.clamp(0, c.n_relations - 1)] + v.first_entity
        )
        n = actions.shape[0]
        observation = torch.stack(
            [torch.full((n,), v.info), torch.where(is_search, found, torch.full_like(found, v.none)),
             torch.full((n,), v.info_end)], dim=1)  # fmt: skip
        return observation, is_search, is_answer, is_answer & (entity == answer)

    def play(self, questions: Questions, actor: Actor) -> Episodes:
        """Run the batched turn loop: the actor writes each turn, the environment answers searches."""
        c, v = self.config, self.vocab
        n = questions.prompts.shape[0]
        tokens = torch.full((n, self.seq_len), v.pad, dtype=torch.long)
        tokens[:, : self.prompt_len] = questions.prompts
        mask = torch.zeros(n, self.seq_len, dtype=torch.long)
        turn_ids = torch.full((n, self.seq_len), -1, dtype=torch.long)
        logp = torch.zeros(n, self.seq_len)
        active = torch.ones(n, dtype=torch.bool)
        correct = torch.zeros(n, dtype=torch.bool)
        well_formed = torch.ones(n, dtype=torch.bool)
        n_turns = torch.zeros(n, dtype=torch.long)
        has_logp = False
        for turn in range(c.max_turns):  # a few turns; each is batched over all episodes
            start = self.turn_start(turn)
            actions, action_logp = actor(tokens[:, :start], turn)
            actions = torch.where(active.unsqueeze(1), actions, torch.full_like(actions, v.pad))
            tokens[:, start : start + TURN_LEN] = actions
            mask[:, start : start + TURN_LEN] = active.long().unsqueeze(1)
            turn_ids[:, start : start + TURN_LEN] = torch.where(active, turn, -1).unsqueeze(1)
            if action_logp is not None:
                has_logp = True
                logp[:, start : start + TURN_LEN] = torch.where(active.unsqueeze(1), action_logp, 0.0)
            n_turns += active.long()
            observation, is_search, is_answer, right = self.respond(actions, questions.answer)
            correct |= active & right
            well_formed &= ~active | is_search | is_answer
            active &= is_search
            if turn + 1 < c.max_turns:
                obs_at = start + TURN_LEN
                tokens[:, obs_at : obs_at + OBS_LEN] = torch.where(
                    active.unsqueeze(1), observation, torch.full_like(observation, v.pad)
                )
            if not active.any():
                break
        well_formed &= ~active  # ran out of turns while still searching
        rewards = correct.float() + c.format_reward * well_formed.float()
        return Episodes(
            tokens, mask, turn_ids, rewards, correct, well_formed, n_turns, logp if has_logp else None
        )

    # ------------------------------------------------------------------ demonstrations
    def expert(self, questions: Questions, error_rate: float, generator: torch.Generator) -> Actor:
        """A demonstrator that follows the chain; in a share ``error_rate`` of episodes one turn uses a wrong entity.

        It reads the last observation from the tokens, so its later turns stay consistent with a mistake.
        """
        c, v = self.config, self.vocab
        n = questions.prompts.shape[0]
        n_steps = questions.hops + 1
        erring = torch.rand(n, generator=generator) < error_rate
        wrong_turn = (torch.rand(n, generator=generator) * n_steps).long()
        noise = torch.randint(0, c.n_entities, (n,), generator=generator)
        wrong_entity = torch.where(noise == questions.answer, (noise + 1) % c.n_entities, noise)

        def act(tokens: Tensor, turn: int) -> tuple[Tensor, None]:
            current = questions.start if turn == 0 else tokens[:, -2] - v.first_entity
            current = current.clamp(0, c.n_entities - 1)
            current = torch.where(erring & (wrong_turn == turn), wrong_entity, current)
            searching = turn < questions.hops
            relation = questions.relations[:, min(turn, c.max_hops - 1)].clamp_min(0) + v.first_relation
            entity = current + v.first_entity
            search = torch.stack(
                [torch.full((n,), v.search), entity, relation, torch.full((n,), v.search_end)], 1
            )
            answer = torch.stack([torch.full((n,), v.answer), entity, torch.full((n,), v.answer_end),
                                  torch.full((n,), v.eos)], 1)  # fmt: skip
            return torch.where(searching.unsqueeze(1), search, answer), None

        return act
