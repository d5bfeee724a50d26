"""Chat conversations to tokens and an assistant-only loss mask (``tokstream tokenize --chat``).

A conversation (``{"messages": [{"role": ..., "content": ...}, ...]}``) is rendered with its
tokenizer's chat template the way ``transformers`` renders it (a sandboxed Jinja2 environment
with ``trim_blocks`` and ``lstrip_blocks``, its ``tojson``, ``raise_exception`` and
``strftime_now``, the tokenizer's special tokens as variables) and tokenized once as
``apply_chat_template(..., tokenize=True)`` tokenizes it: no special token added, a special
token's text in the rendered text read as that token. Which tokens are trained:

1. A template with ``{% generation %}`` spans: the tokens of its spans, mapped from characters
   to tokens with the tokenizer's offsets exactly as ``return_assistant_tokens_mask`` maps them.
2. A template without: assistant turn ``k``'s trained tokens start where the messages before it,
   rendered with ``add_generation_prompt=True``, end (a prefix of the whole conversation's
   text), and run through the first end-of-turn token after that: the first special token the
   template writes after an assistant's content (``<|eot_id|>``, ``<|im_end|>``,
   ``<end_of_turn>``, ``<|end|>``, ...), found once per template. Whitespace the template writes
   after it is not trained (the model stops at the token). The role header, every system, user
   and tool message and anything the template writes before the first message are never
   trained.
3. A template for which rule 2 does not recover every turn exactly (it renders an assistant turn
   one way when it is the last message and another when more follow, as Qwen 3's stock template
   does with the thinking block; or writes nothing a turn can end on) is refused before
   anything is written, by :class:`ChatTemplateError`: one line naming the template and what to
   do instead.

A conversation that is malformed, fails to render, renders its earlier messages differently
when more follow, or has an assistant message with no trained token is a :class:`BadConversation`
(a ValueError); the caller names the file and line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from tokstream._extras import install_hint

#: The roles a message may have.
ROLES = ("system", "developer", "user", "assistant", "tool")
#: The special tokens transformers passes to a template as variables.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: What the template is asked to render to find its end-of-turn token and check rule 2.
PROBES: tuple[list[dict[str, str]], ...] = (
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green."},
    ],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green."},
    ],
)


class ChatTemplateError(ValueError):
    """A chat template tokstream cannot mask exactly: refused before anything is written."""


class BadConversation(ValueError):
    """A conversation that cannot be written (the caller adds where it is)."""


# ---------------------------------------------------------------------------------------------
# Where the template and the tokenizer come from


@dataclass(frozen=True)
class ChatSpec:
    """What a chat encoder is made from: small and picklable, the same in every worker."""

    #: The ``tokenizers`` JSON file.
    tokenizer_file: str
    #: The template's source text, and what messages call it.
    template: str
    template_name: str
    #: The special tokens the template sees as variables (``bos_token``, ``eos_token``, ...).
    special_tokens: tuple[tuple[str, str], ...]

    @property
    def fingerprint(self) -> str:
        """What decides the output beyond the inputs: the tokenizer, the template, its tokens."""
        digest = hashlib.sha256(Path(self.tokenizer_file).read_bytes())
        digest.update(json.dumps([self.template, list(self.special_tokens)]).encode("utf-8"))
        return "sha256:" + digest.hexdigest()


def load_spec(tokenizer: str, chat_template: str | os.PathLike[str] | None = None) -> ChatSpec:
    """The chat spec of ``tokenizer`` (a directory holding ``tokenizer.json``, or that file).

    The template is ``chat_template`` (a file) when given, else the tokenizer directory's
    ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (its
    ``"default"`` one when it holds several). The special tokens come from
    ``tokenizer_config.json`` (and ``special_tokens_map.json``) beside the tokenizer.
    """
    path = Path(tokenizer)
    directory = path if path.is_dir() else path.parent
    tokenizer_file = path / "tokenizer.json" if path.is_dir() else path
    if not tokenizer_file.is_file():
        raise FileNotFoundError(2, "tokenizer file not found", os.fspath(tokenizer_file))
    config = _json_file(directory / "tokenizer_config.json")
    special: dict[str, str] = {}
    for source in (_json_file(directory / "special_tokens_map.json"), config):
        for name in SPECIAL_TOKEN_NAMES:
            value = source.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                special[name] = value
    if chat_template is not None:
        template_path = Path(chat_template)
        try:
            template = template_path.read_text(encoding="utf-8")
        except OSError as exc:
            raise FileNotFoundError(
                exc.errno, "chat template not found", os.fspath(template_path)
            ) from None
        name = os.fspath(template_path)
    elif (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        name = os.fspath(directory / "chat_template.jinja")
    else:
        found = config.get("chat_template")
        if isinstance(found, list):
            found = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
            found = found.get("default")
        if not isinstance(found, str):
            raise ValueError(
                f"tokenizer {tokenizer} has no chat template (no chat_template.jinja, no "
                "chat_template in tokenizer_config.json); pass one with --chat-template FILE"
            )
        template = found
        name = f"{directory / 'tokenizer_config.json'} (its chat_template)"
    return ChatSpec(os.fspath(tokenizer_file), template, name, tuple(sorted(special.items())))


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"tokenizer file {path}: unreadable JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"tokenizer file {path}: not a JSON object")
    return loaded


# ---------------------------------------------------------------------------------------------
# Rendering, as transformers renders


def _jinja() -> Any:
    try:
        import jinja2
    except ImportError:
        raise ImportError(f"--chat needs jinja2: {install_hint('chat')}") from None
    return jinja2


def compile_template(source: str, name: str) -> Any:
    """The template compiled in transformers' environment, with a tracker of generation spans."""
    jinja2 = _jinja()
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class GenerationSpans(Extension):  # type: ignore[misc]  # jinja2 is typed as Any
        """``{% generation %}...{% endgeneration %}``: the characters each span rendered."""

        tags = {"generation"}

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            self.blocks: list[str] | None = None
            self.spans: list[tuple[int, int]] = []

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_span", [])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _span(self, caller: Any) -> str:
            text: str = caller()
            if self.blocks is not None:
                start = sum(map(len, self.blocks))
                self.spans.append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        """``dict(...)`` in a template, without the type itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(Namespace):  # type: ignore[misc]  # jinja2 is typed as Any
        """``namespace(...)`` refusing underscore-prefixed attributes, as transformers' does."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for key in attributes:
                TemplateNamespace._check(key)
            Namespace.__init__(self, attributes)

        def __setitem__(self, key: Any, value: Any) -> None:
            TemplateNamespace._check(key)
            Namespace.__setitem__(self, key, value)

        @staticmethod
        def _check(key: Any) -> None:
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot store {key!r} on a namespace"
                )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationSpans, loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    try:
        template = environment.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template {name}: not a Jinja2 template (line {exc.lineno}: {exc.message})"
        ) from None
    tracker = next(e for e in environment.extensions.values() if isinstance(e, GenerationSpans))
    return template, tracker, _has_generation_tag(environment, source)


def _has_generation_tag(environment: Any, source: str) -> bool:
    """Whether the template holds a ``{% generation %}`` block (its lexer's view, not a grep)."""
    return any(
        kind == "name" and value == "generation" and previous == "block_begin"
        for previous, (_, kind, value) in _pairs(environment.lex(source))
    )


def _pairs(tokens: Iterator[tuple[int, str, str]]) -> Iterator[tuple[str, tuple[int, str, str]]]:
    previous = ""
    for token in tokens:
        if token[1] != "whitespace":
            yield previous, token
            previous = token[1]


# ---------------------------------------------------------------------------------------------
# The encoder


@dataclass
class Encoded:
    """One conversation: its token ids and, per token, whether the loss trains on it."""

    ids: np.ndarray
    mask: np.ndarray


class ChatEncoder:
    """A chat template and its tokenizer, checked (rule 3) and ready to encode conversations.

    Raises :class:`ChatTemplateError` when the template cannot be masked exactly, ImportError
    when jinja2 or tokenizers is missing.
    """

    def __init__(self, spec: ChatSpec) -> None:
        self.spec = spec
        try:
            import tokenizers
        except ImportError:
            raise ImportError(
                f"--chat needs the tokenizers package: {install_hint('chat')}"
            ) from None
        try:
            tokenizer = tokenizers.Tokenizer.from_file(spec.tokenizer_file)
        except Exception as exc:  # the Rust side raises plain Exceptions
            raise ValueError(
                f"tokenizer {spec.tokenizer_file}: not a tokenizers JSON file: {exc}"
            ) from None
        # As transformers calls it: no padding, no truncation, special tokens' texts are tokens.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        with contextlib.suppress(AttributeError):
            tokenizer.encode_special_tokens = False
        self._tokenizer = tokenizer
        self.fingerprint = spec.fingerprint
        vocabulary = tokenizer.get_vocab(with_added_tokens=True)
        self.max_id = max(vocabulary.values(), default=0)
        self._special = {
            id for id, token in tokenizer.get_added_tokens_decoder().items() if token.special
        }
        self._template, self._tracker, self.has_spans = compile_template(
            spec.template, spec.template_name
        )
        self._variables = dict(spec.special_tokens)
        #: Rule 2's end-of-turn token (-1 for a template with generation spans).
        self.end_of_turn = -1
        self._check_template()

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self, messages: Sequence[Any], add_generation_prompt: bool = False, **extra: Any
    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and its generation spans (characters), as transformers
        renders them; a :class:`BadConversation` when the template raises."""
        jinja2 = _jinja()
        blocks: list[str] = []
        tracker = self._tracker
        tracker.blocks, tracker.spans = blocks, []
        try:
            for block in self._template.generate(
                messages=messages,
                tools=extra.pop("tools", None),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._variables,
                **extra,
            ):
                blocks.append(block)
        except jinja2.exceptions.TemplateError as exc:
            raise BadConversation(
                f"chat template {self.spec.template_name} failed: {exc}"
            ) from None
        except (TypeError, KeyError, AttributeError, IndexError, ValueError) as exc:
            raise BadConversation(
                f"chat template {self.spec.template_name} failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            spans = tracker.spans
            tracker.blocks, tracker.spans = None, []
        return "".join(blocks), spans

    def tokenize(self, text: str) -> Any:
        """The ``tokenizers`` encoding of rendered text, as ``apply_chat_template`` makes it."""
        return self._tokenizer.encode(text, add_special_tokens=False)

    # -- the template check --------------------------------------------------------------------

    def _refuse(self, why: str) -> ChatTemplateError:
        return ChatTemplateError(
            f"chat template {self.spec.template_name}: {why}; pass a template with "
            "{% generation %} spans with --chat-template FILE (TRL ships such templates as "
            "trl/chat_templates/*_training.jinja)"
        )

    def _check_template(self) -> None:
        """Find the end-of-turn token and check rule 2 on the probe conversations, or refuse."""
        for probe in PROBES:
            try:
                text, spans = self.render(probe)
            except BadConversation as exc:
                if probe[0]["role"] == "system":
                    continue  # a template may refuse system messages
                raise self._refuse(f"it cannot render a plain conversation ({exc})") from None
            if self.has_spans:
                if not spans or not any(b > a for a, b in spans):
                    raise self._refuse("its {% generation %} spans render no assistant text")
                continue
            if not any(m["content"] in text for m in probe if m["role"] == "assistant"):
                raise self._refuse("it renders no assistant text")
            if self.end_of_turn < 0:
                self.end_of_turn = self._find_end_of_turn(probe)
            encoding = self.tokenize(text)
            for k, message in enumerate(probe):
                if message["role"] != "assistant":
                    continue
                start, end = self._turn(text, encoding, probe, k)
                turn = text[start:end]
                alone, _ = self.render(probe[: k + 1])
                alone_encoding = self.tokenize(alone)
                a, b = self._turn(alone, alone_encoding, probe[: k + 1], k)
                if alone[a:b] != turn:
                    raise self._refuse(
                        "it is not prefix-preserving: it renders an assistant turn differently "
                        f"when more messages follow ({alone[a:b]!r} as the last message, "
                        f"{turn!r} before others)"
                    )
                if message["content"] not in turn:
                    raise self._refuse(
                        f"an assistant turn's tokens {turn!r} do not hold its content"
                    )

    def _find_end_of_turn(self, probe: list[dict[str, str]]) -> int:
        """The first special token the template writes after an assistant's content."""
        k = next(i for i, m in enumerate(probe) if m["role"] == "assistant")
        before, _ = self.render(probe[:k], add_generation_prompt=True)
        whole, _ = self.render(probe[: k + 1])
        content = probe[k]["content"]
        at = whole.find(content, len(before)) if whole.startswith(before) else -1
        if at < 0:
            raise self._refuse(
                "the messages before an assistant turn, rendered with add_generation_prompt, "
                "are not where the turn starts"
            )
        after = self.tokenize(whole[at + len(content) :]).ids
        found = next((id for id in after if id in self._special), None)
        if found is None:
            raise self._refuse(
                f"it writes no special token after an assistant's content ({whole[at:]!r}) "
                "to end the turn on"
            )
        return int(found)

    def _turn(self, text: str, encoding: Any, messages: Sequence[Any], k: int) -> tuple[int, int]:
        """Rule 2: the characters of assistant turn ``k``'s trained tokens in ``text``."""
        first, last = self._turn_tokens(text, encoding, messages, k)
        offsets = encoding.offsets
        return offsets[first][0], offsets[last][1]

    def _turn_tokens(
        self, text: str, encoding: Any, messages: Sequence[Any], k: int
    ) -> tuple[int, int]:
        """Rule 2: the first and last token (inclusive) assistant turn ``k`` trains."""
        before, _ = self.render(messages[:k], add_generation_prompt=True)
        if not text.startswith(before):
            raise BadConversation(
                f"chat template {self.spec.template_name} renders the messages before "
                f"message {k} (assistant) differently when more follow"
            )
        first = _token_at(encoding, len(before))
        ids = encoding.ids
        last = first
        while last < len(ids) and ids[last] != self.end_of_turn:
            last += 1
        if first >= len(ids) or last >= len(ids):
            raise BadConversation(
                f"message {k} (assistant) renders no end-of-turn token "
                f"{self._tokenizer.id_to_token(self.end_of_turn)!r}"
            )
        return first, last

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, record: Any) -> Encoded:
        """One conversation record's tokens and mask; :class:`BadConversation` for a bad one."""
        messages, extra = conversation(record)
        text, spans = self.render(messages, **extra)
        encoding = self.tokenize(text)
        ids = np.asarray(encoding.ids, dtype=np.int64)
        mask = np.zeros(ids.shape[0], dtype=np.bool_)
        assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if self.has_spans:
            mark_spans(mask, encoding, spans)
            if assistants and not mask.any():
                raise BadConversation(
                    f"its {len(assistants)} assistant message(s) render no trained token "
                    f"(no {{% generation %}} span of chat template {self.spec.template_name})"
                )
            return Encoded(ids, mask)
        end = 0
        for k in assistants:
            first, last = self._turn_tokens(text, encoding, messages, k)
            if first < end:
                raise BadConversation(f"message {k} (assistant) starts inside the turn before it")
            mask[first : last + 1] = True
            end = last + 1
        return Encoded(ids, mask)


def _token_at(encoding: Any, char: int) -> int:
    """The token holding character ``char``, else the first after it (its count if none)."""
    found = encoding.char_to_token(char)
    if found is not None:
        return int(found)
    offsets = encoding.offsets
    return next((i for i, (a, _) in enumerate(offsets) if a >= char), len(offsets))


def mark_spans(mask: np.ndarray, encoding: Any, spans: Sequence[tuple[int, int]]) -> None:
    """Set, in ``mask``, every token whose characters overlap one of the character ``spans``
    (in rendering order), as ``return_assistant_tokens_mask`` sets them."""
    index = 0
    for token, (start, end) in enumerate(encoding.offsets):
        while index < len(spans) and start >= spans[index][1]:
            index += 1
        if index == len(spans):
            return
        if end > spans[index][0]:
            mask[token] = True


def conversation(record: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A record's messages, checked, and what else its template sees (``tools``)."""
    if not isinstance(record, dict) or "messages" not in record:
        raise BadConversation("no 'messages' list")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadConversation(f"'messages' is {type(messages).__name__}, not a nonempty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise BadConversation(f"message {i} has no 'role'")
        if message["role"] not in ROLES:
            raise BadConversation(
                f"message {i} has unknown role {message['role']!r} (known: {', '.join(ROLES)})"
            )
    extra = {}
    if isinstance(record.get("tools"), list):
        extra["tools"] = record["tools"]
    return [_as_template_sees(message) for message in messages], extra


#: The names a message's reasoning comes under; templates read the first.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _as_template_sees(message: dict[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to a template: keys whose value is None dropped, its
    reasoning under each of :data:`REASONING_FIELDS` (``thinking`` first)."""
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in REASONING_FIELDS if key in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message
