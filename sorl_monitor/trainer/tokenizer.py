"""The task's word-level vocabulary and a ``transformers`` tokenizer built from it in code (no hub).

Tokens: specials (``<pad> <bos> <eos> <search> </search> <info> </info> <answer> </answer> <none>
<nil>``), relations ``r0 … r{R-1}`` and entities ``e0 … e{E-1}``. Ids are laid out in that order, so
"is an entity" and "is a relation" are range checks on tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

SPECIALS = (
    "<pad>", "<bos>", "<eos>", "<search>", "</search>", "<info>", "</info>",
    "<answer>", "</answer>", "<none>", "<nil>",
)  # fmt: skip


@dataclass(frozen=True)
class Vocab:
    """Word-level vocabulary of the search task: ``len(SPECIALS) + n_relations + n_entities`` tokens."""

    n_relations: int
    n_entities: int

    @cached_property
    def tokens(self) -> tuple[str, ...]:
        relations = tuple(f"r{i}" for i in range(self.n_relations))
        entities = tuple(f"e{i}" for i in range(self.n_entities))
        return SPECIALS + relations + entities

    @cached_property
    def ids(self) -> dict[str, int]:
        return {token: index for index, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __getattr__(self, name: str) -> int:
        # vocab.search → id of "<search>", vocab.search_end → id of "</search>"
        if name.startswith("_"):
            raise AttributeError(name)
        word = f"</{name[:-4]}>" if name.endswith("_end") else f"<{name}>"
        try:
            return self.ids[word]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def first_relation(self) -> int:
        return len(SPECIALS)

    @property
    def first_entity(self) -> int:
        return len(SPECIALS) + self.n_relations

    def relation(self, index: int) -> int:
        return self.first_relation + index

    def entity(self, index: int) -> int:
        return self.first_entity + index

    def encode(self, words: list[str] | str) -> list[int]:
        if isinstance(words, str):
            words = words.split()
        return [self.ids[word] for word in words]

    def decode(self, ids) -> str:
        return " ".join(self.tokens[int(i)] for i in ids)

    def hf_tokenizer(self):
        """A ``PreTrainedTokenizerFast`` (word level, whitespace split) over this vocabulary."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        backend = Tokenizer(models.WordLevel(vocab=dict(self.ids), unk_token="<none>"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            pad_token="<pad>",
            bos_token="<bos>",
            eos_token="<eos>",
            unk_token="<none>",
        )
