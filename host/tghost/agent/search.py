"""search: the live tools ranked for a plain-language request, so an agent can find the few it
needs among thousands (``ToolDirectory.search``, ``tghost tools --search``, ``tghost mcp
--tool-search``).

Ranking is BM25 with English (Snowball) stemming, without stop words, over three fields, weighted by
:data:`FIELD_BOOSTS`: the tool's name (split at ``-`` and ``_``), its description, and its
arguments' names and descriptions. The index is tantivy's, in memory; this module only says
what each tool's document holds and turns a request into a query.

The directory hands every change of a tool to :meth:`ToolIndex.put`, which only notes it; the
next search applies what changed first, so a search always sees the live tools of that moment
and a catch-up of thousands of tools pays nothing until someone searches.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from tghost.agent.entries import DirectoryTool
from tghost.protocol.descriptors import ToolDescriptor

if TYPE_CHECKING:
    import tantivy

__all__ = ["FIELD_BOOSTS", "MAX_LIMIT", "MAX_WORDS", "Found", "SearchError", "ToolIndex", "check_limit", "words_of"]

#: How much a match in each field counts (BM25 scores multiplied).
FIELD_BOOSTS = {"name": 3.0, "description": 1.0, "arguments": 0.6}
#: Words of a request that are searched for; the rest of a long request is ignored.
MAX_WORDS = 64
#: The most results one search returns.
MAX_LIMIT = 1000
#: Bytes of memory tantivy's writer may use while it applies changes (its minimum is 15 MB);
#: the writer is dropped, and its memory freed, once they are applied.
WRITER_HEAP = 15_000_000

_WORD = re.compile(r"\w+")
#: The name tools' fields and requests are analysed under (:func:`_analyzer`).
ANALYZER = "tghost_en"


def _analyzer() -> tantivy.TextAnalyzer:
    import tantivy

    """Words (letters and digits of any script), lowercased, without English stop words
    ("is", "the", "in", ...), Snowball-stemmed: "forecasts" and "forecasting" are one word."""
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stopword("english"))
            .filter(tantivy.Filter.stemmer("english")).build())


class Found(NamedTuple):
    """A live tool a search found, and its ``score`` (BM25 with :data:`FIELD_BOOSTS`; higher is better)."""

    tool: DirectoryTool
    score: float


class SearchError(ValueError):
    """A request that cannot be searched: no words in it, or a ``limit`` outside 1..:data:`MAX_LIMIT`.
    The message says what to send instead."""


def words_of(query: str) -> list[str]:
    """The words searched for in ``query``: runs of letters and digits (any script), lowercased,
    the first :data:`MAX_WORDS` of them.

    Raises:
        SearchError: the query has no letter or digit (empty, blank, symbols only).
    """
    words = _WORD.findall(query.lower())[:MAX_WORDS]
    if not words:
        raise SearchError("the query has no words to search for: describe what the tool should do, "
                          "e.g. 'weather forecast for a city'")
    return words


def check_limit(limit: int) -> int:
    """``limit`` if it is a whole number (not a bool) from 1 to :data:`MAX_LIMIT`.

    Raises:
        SearchError: it is not.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise SearchError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit!r}")
    return limit


def _document(descriptor: ToolDescriptor) -> dict[str, str]:
    """The text of one tool's fields: its name, description and arguments (each argument's
    name and description, from its seed 000 ``arguments`` and its ``input-schema`` properties)."""
    arguments = [f"{a.name} {a.description}" for a in descriptor.arguments]
    properties = (descriptor.input_schema or {}).get("properties")
    if isinstance(properties, dict):
        arguments += [f"{name} {_description(spec)}" for name, spec in properties.items()]
    return {"name": descriptor.name, "description": descriptor.description, "arguments": " ".join(arguments)}


def _description(spec: Any) -> str:
    return str(spec.get("description", "")) if isinstance(spec, dict) else ""


class ToolIndex:
    """A tantivy index of tools by name: :meth:`put` notes a tool's new descriptor (``None``:
    gone), :meth:`ranked` applies what was noted and yields names best first. Not thread-safe:
    one event loop uses it."""

    def __init__(self) -> None:
        self._pending: dict[str, ToolDescriptor | None] = {}
        self._count = 0

    @functools.cached_property
    def _index(self) -> tantivy.Index:
        """The index, made at the first search (a directory that never searches never loads tantivy)."""
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("key", stored=True, tokenizer_name="raw")
        for field in FIELD_BOOSTS:
            builder.add_text_field(field, tokenizer_name=ANALYZER)
        index = tantivy.Index(builder.build())
        index.register_tokenizer(ANALYZER, _analyzer())
        return index

    def put(self, name: str, descriptor: ToolDescriptor | None) -> None:
        """Note that tool ``name`` now has ``descriptor`` (``None``: it is no longer live)."""
        self._pending[name] = descriptor

    def _apply(self) -> None:
        """Write every noted change, then commit and reload: one tantivy commit per batch."""
        if not self._pending:
            return
        import tantivy

        writer = self._index.writer(heap_size=WRITER_HEAP, num_threads=1)
        for name, descriptor in self._pending.items():
            writer.delete_documents_by_term("key", name)
            if descriptor is not None:
                writer.add_document(tantivy.Document(key=name, **_document(descriptor)))
        writer.commit()
        writer.wait_merging_threads()  # drops the writer and its memory
        self._index.reload()
        self._pending.clear()
        self._count = self._index.searcher().num_docs

    def ranked(self, query: str, admit: Callable[[str], bool], limit: int) -> Iterator[tuple[str, float]]:
        """The names of up to ``limit`` indexed tools that match ``query`` and that ``admit``
        lets through, with their scores, best first (ties by name).

        Raises:
            SearchError: see :func:`words_of` and :func:`check_limit`.
        """
        words, limit = words_of(query), check_limit(limit)
        self._apply()
        try:
            parsed = self._index.parse_query(" ".join(words), list(FIELD_BOOSTS), field_boosts=FIELD_BOOSTS)
        except ValueError:  # only stop words ("is it"): nothing to look for, so nothing matches
            return
        searcher = self._index.searcher()
        wanted = limit
        while True:
            hits = searcher.search(parsed, min(wanted, max(self._count, 1))).hits
            ranked = sorted(((score, searcher.doc(address)["key"][0]) for score, address in hits),
                            key=lambda hit: (-hit[0], hit[1]))
            chosen = [(name, score) for score, name in ranked if admit(name)][:limit]
            if len(chosen) >= limit or len(hits) < wanted:
                yield from chosen
                return
            wanted *= 4  # the filter left too few: look further down the ranking
