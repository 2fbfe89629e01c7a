"""tghost-knowledge: seed 000's ``custom-rag`` tool service, answering questions from a bundled corpus.

One service ranks short documents with BM25 (bm25s); each tool picks a collection (customers, products,
orders) with its ``collection`` config value, so ``query-customers`` and ``query-products`` share the service.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import tghost

__all__ = ["Document", "Hit", "Index", "KnowledgeBase", "knowledge_base"]

DEFAULT_LIMIT = 3
MAX_LIMIT = 10
_CORPUS = resources.files(__name__) / "corpus"


@dataclass(frozen=True)
class Document:
    """One passage: an entry ``{"id", "title", "text"}`` of ``corpus/<collection>.json``."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    """A document that shares at least one word stem with the question, and its BM25 score (> 0)."""

    document: Document
    score: float


def _bm25s() -> Any:
    """The bm25s module, imported on first use so that importing the plugin stays cheap.

    bm25s sets its own logger to DEBUG when imported; put it back under the host's log level.
    """
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.NOTSET)
    return bm25s


def _tokenize(texts: list[str], *, return_ids: bool) -> Any:
    """Lower-case and split ``texts`` into words, drop English stopwords, stem (Snowball).

    The stopwords are NLTK's list (``en_plus``); bm25s' shorter ``en`` list keeps "which", "who" or "how",
    and those would rank documents by the question's wording.

    Returns bm25s' ``Tokenized`` (ids and vocabulary) or, without ``return_ids``, a list of stems per text.
    """
    import Stemmer

    # A Stemmer keeps internal state and must not be shared between threads; a new one costs under 1 µs.
    stemmer = Stemmer.Stemmer("english")
    return _bm25s().tokenize(texts, stopwords="en_plus", stemmer=stemmer, return_ids=return_ids, show_progress=False)


class Index:
    """A BM25 index over the title and text of ``documents``. Read-only once built, so threads may share it."""

    def __init__(self, documents: Sequence[Document]) -> None:
        self.documents = tuple(documents)
        self._bm25 = _bm25s().BM25()
        self._bm25.index(_tokenize([f"{d.title}\n{d.text}" for d in self.documents], return_ids=True),
                         show_progress=False)

    def search(self, question: str, limit: int) -> list[Hit]:
        """At most ``limit`` hits for ``question``, best first; ``[]`` when no document shares a word stem."""
        [stems] = _tokenize([question], return_ids=False)
        token_ids = self._bm25.get_tokens_ids(stems)  # stems the corpus never uses are dropped
        if not token_ids:
            return []
        scores = self._bm25.get_scores_from_ids(token_ids)  # one float per document
        best = sorted(range(len(self.documents)), key=lambda i: -scores[i])[:limit]
        return [Hit(self.documents[i], float(scores[i])) for i in best if scores[i] > 0]


class KnowledgeBase(tghost.ToolService):
    """Seed 000's ``custom-rag``: answers ``question`` from the collection named by the ``collection`` config.

    ``invoke`` is plain code, so the host runs it in worker threads, several at once. Each collection's
    index is built on its first question, exactly once, and kept. Override :meth:`collections` and
    :meth:`documents` to serve other documents.
    """

    id = "custom-rag"
    description = "Answer a question with the best-matching passages of a document collection (BM25 ranking)."
    config_params = (tghost.ConfigParam(name="collection", required=True),)
    # A schema, not an ``arguments`` list: ``limit`` is optional, and an ``arguments`` list makes
    # every argument required. The tools' seed 000 ``arguments`` are derived from it.
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question to ask, in plain words"},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT,
                      "description": f"Optional: how many passages, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})"},
        },
        "required": ["question"],
    }

    def __init__(self) -> None:
        self._indexes: dict[str, Index] = {}
        self._lock = threading.Lock()

    def collections(self) -> list[str]:
        """The collection names, sorted: one per ``corpus/<name>.json`` file of this package."""
        return sorted(p.name.removesuffix(".json") for p in _CORPUS.iterdir() if p.name.endswith(".json"))

    def documents(self, collection: str) -> list[Document]:
        """The documents of ``collection``, one of :meth:`collections`.

        Raises:
            FileNotFoundError: no such collection.
        """
        return [Document(**entry) for entry in json.loads((_CORPUS / f"{collection}.json").read_text("utf-8"))]

    def index(self, collection: str) -> Index:
        """The index of ``collection``, built on first use (once, however many threads ask) and then cached.

        Raises:
            FileNotFoundError: no such collection.
        """
        with self._lock:
            if collection not in self._indexes:
                self._indexes[collection] = Index(self.documents(collection))
            return self._indexes[collection]

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        """Answer ``arguments["question"]`` from the collection ``config["collection"]``.

        Returns the best passages, ``"[1] <title> (score 2.31)\\n<text>\\n\\n[2] ..."``, or, when no
        passage shares a word with the question, ``"No document in '<collection>' matches '<question>'."``.

        Raises:
            tghost.InvalidArguments: ``question`` is not a non-empty string, or ``limit`` not an integer in 1..10.
            tghost.ToolError: ``invalid-config``: ``collection`` is not one of :meth:`collections`.
        """
        question = arguments.get("question")
        if not isinstance(question, str) or not question.strip():
            raise tghost.InvalidArguments("argument 'question': must be a non-empty string")
        limit = arguments.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise tghost.InvalidArguments(f"argument 'limit': must be an integer from 1 to {MAX_LIMIT}")
        collection, known = config["collection"], self.collections()
        if collection not in known:
            raise tghost.ToolError(f"unknown collection {collection!r}; known: {', '.join(known)}", "invalid-config")

        hits = self.index(collection).search(question, limit)
        if not hits:
            return f"No document in '{collection}' matches {question!r}."
        return "\n\n".join(
            f"[{rank}] {hit.document.title} (score {hit.score:.2f})\n{hit.document.text}"
            for rank, hit in enumerate(hits, start=1)
        )


knowledge_base = KnowledgeBase()

# Seed 001: a knowledge query is a first step (state "undefined" or "research") that moves the agent to "analysis".
_WORKFLOW: dict[str, Any] = {
    "group": ["default", "read-only", "knowledge"],
    "state": "analysis",
    "available_in_states": ["undefined", "research"],
}


@tghost.hookimpl
def tghost_register_services(register: Callable[[tghost.ToolService], None]) -> None:
    """Serve :data:`knowledge_base` as ``custom-rag``."""
    register(knowledge_base)


@tghost.hookimpl
def tghost_register_tools(register: Callable[[tghost.ToolDescriptor], None]) -> None:
    """Two tools over ``custom-rag``, differing only in their ``collection`` config value.

    ``query-orders`` over the ``orders`` collection is declared in a deployment's TOML instead
    (see ``examples/tools.toml`` in the tghost repository).
    """
    register(knowledge_base.tool("query-customers", "Query the customer knowledge base",
                                 collection="customers", **_WORKFLOW))
    register(knowledge_base.tool("query-products", "Query the product knowledge base",
                                 collection="products", **_WORKFLOW))
