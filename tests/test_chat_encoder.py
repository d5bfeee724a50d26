"""The chat encoder: rendered tokens equal to transformers', and the assistant-only mask rule.

Oracles: ``transformers``' ``apply_chat_template`` (tokens, and ``return_assistant_tokens_mask``
for templates with generation spans), TRL's ``*_training.jinja`` variants of the stock
templates, and, for stock templates, the characters of each assistant message's content found
in the rendered text independently of the encoder.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.chat_families import FAMILIES, conversations, make_tokenizer, template_text

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

from tokstream.tokenize.chat import (  # noqa: E402
    BadConversation,
    ChatEncoder,
    ChatTemplateError,
    load_spec,
)

#: The stock templates rule 2 masks (Qwen 3's is refused: see below).
MASKED = ("llama3", "qwen2_5", "gemma3", "phi3")


@functools.cache
def _directory(tmp_root: str, family: str, training: bool) -> str:
    from pathlib import Path

    fam = FAMILIES[family]
    template = template_text(fam.training) if training else None
    where = Path(tmp_root) / f"{family}{'_training' if training else ''}"
    return str(make_tokenizer(fam, where, template))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("chat_tokenizers"))


def hf_tokenizer(directory: str):
    return transformers.AutoTokenizer.from_pretrained(directory)


def expected_stock_mask(messages, ids, offsets, text: str, eot: int) -> np.ndarray:
    """Rule 2 from the outside: each assistant content's characters, found in order in the
    rendered text, through the end-of-turn token after them; nothing else."""
    mask = np.zeros(len(ids), dtype=bool)
    at = 0
    for message in messages:
        content = message["content"].strip()
        # Every family's template writes a newline right before a message's content.
        found = text.find("\n" + content, at) + 1
        assert found > 0
        at = found + len(content)
        if message["role"] != "assistant":
            continue
        covered = [i for i, (a, b) in enumerate(offsets) if b > found and a < at]
        end = next(i for i in range(covered[-1] + 1, len(ids)) if ids[i] == eot)
        mask[covered[0] : end + 1] = True
    return mask


@pytest.mark.parametrize("family", MASKED)
def test_stock_templates_render_transformers_tokens_and_train_each_assistant_content_and_eot(
    root, family
):
    directory = _directory(root, family, False)
    encoder = ChatEncoder(load_spec(directory))
    tokenizer = hf_tokenizer(directory)
    eot = tokenizer.convert_tokens_to_ids(
        {"llama3": "<|eot_id|>", "qwen2_5": "<|im_end|>", "gemma3": "<end_of_turn>"}.get(
            family, "<|end|>"
        )
    )
    assert encoder.end_of_turn == eot and not encoder.has_spans
    for record in conversations(120, seed=3):
        encoded = encoder.encode(record)
        want = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=True)
        assert encoded.ids.tolist() == list(want["input_ids"])
        text = tokenizer.apply_chat_template(record["messages"], tokenize=False)
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        expected = expected_stock_mask(record["messages"], encoded.ids.tolist(), offsets, text, eot)
        np.testing.assert_array_equal(encoded.mask, expected)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generation_spans_give_transformers_assistant_mask(root, family):
    directory = _directory(root, family, True)
    encoder = ChatEncoder(load_spec(directory))
    tokenizer = hf_tokenizer(directory)
    assert encoder.has_spans
    for record in conversations(150, seed=4):
        encoded = encoder.encode(record)
        want = tokenizer.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert encoded.ids.tolist() == list(want["input_ids"])
        assert encoded.mask.astype(int).tolist() == list(want["assistant_masks"])
        assert encoded.mask.any()


@pytest.mark.parametrize("family", MASKED)
def test_stock_masks_agree_with_trl_training_templates_on_content_and_eot(root, family):
    """Where TRL's training template renders the same tokens, the two masks differ only on
    whitespace after the end-of-turn token (TRL trains it, tokstream does not) and, for Phi-3,
    the end-of-text token the template writes after the last turn."""
    stock = ChatEncoder(load_spec(_directory(root, family, False)))
    training = ChatEncoder(load_spec(_directory(root, family, True)))
    tokenizer = hf_tokenizer(_directory(root, family, False))
    compared = 0
    for record in conversations(100, seed=5):
        a, b = stock.encode(record), training.encode(record)
        if a.ids.tolist() != b.ids.tolist():
            continue
        compared += 1
        differ = np.nonzero(a.mask != b.mask)[0]
        assert not a.mask[differ].any()  # only TRL trains more
        tokens = set(tokenizer.convert_ids_to_tokens(a.ids[differ].tolist()))
        assert tokens <= {"Ċ", "<|endoftext|>" if family == "phi3" else "Ċ"}
    assert compared == 100


@pytest.mark.parametrize("family", MASKED)
def test_system_and_user_tokens_are_never_trained(root, family):
    encoder = ChatEncoder(load_spec(_directory(root, family, False)))
    tokenizer = hf_tokenizer(_directory(root, family, False))
    for record in conversations(40, seed=6, system=True):
        encoded = encoder.encode(record)
        trained = tokenizer.decode(encoded.ids[encoded.mask].tolist())
        for message in record["messages"]:
            if message["role"] != "assistant" and len(message["content"]) > 30:
                assert message["content"] not in trained


def test_qwen3_stock_template_is_refused_in_one_line_naming_it_and_the_way_out(root):
    directory = _directory(root, "qwen3", False)
    with pytest.raises(ChatTemplateError) as caught:
        ChatEncoder(load_spec(directory))
    message = str(caught.value)
    assert "\n" not in message.replace("\\n", "")
    assert "tokenizer_config.json" in message and "not prefix-preserving" in message
    assert "--chat-template" in message and "_training.jinja" in message


REFUSED_TEMPLATES = {
    "no special token ends a turn": (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}",
        "writes no special token after an assistant's content",
    ),
    "no assistant text": (
        "{% for m in messages %}{% if m.role != 'assistant' %}<|im_start|>{{ m.content }}"
        "<|im_end|>{% endif %}{% endfor %}",
        "renders no assistant text",
    ),
    "spans around nothing": (
        "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>"
        "{% generation %}{% endgeneration %}{% endfor %}",
        "spans render no assistant text",
    ),
    "prompt not a prefix": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>bot\n{% endif %}",
        "are not where the turn starts",
    ),
    "not Jinja": ("{% for m in messages %}", "not a Jinja2 template"),
}


@pytest.mark.parametrize("case", list(REFUSED_TEMPLATES))
def test_templates_that_cannot_be_masked_exactly_are_refused(root, tmp_path, case):
    source, match = REFUSED_TEMPLATES[case]
    template = tmp_path / "template.jinja"
    template.write_text(source)
    with pytest.raises(ChatTemplateError, match=match) as caught:
        ChatEncoder(load_spec(_directory(root, "qwen2_5", False), template))
    assert str(template) in str(caught.value) and "\n" not in str(caught.value)


def test_a_tokenizer_without_a_template_is_refused(root, tmp_path):
    import shutil

    shutil.copy(f"{_directory(root, 'qwen2_5', False)}/tokenizer.json", tmp_path)
    with pytest.raises(ValueError, match="has no chat template.*--chat-template"):
        load_spec(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        load_spec(str(tmp_path), tmp_path / "missing.jinja")


BAD_RECORDS = {
    "no messages": ({"text": "hi"}, "no 'messages' list"),
    "messages not a list": ({"messages": "hi"}, "not a nonempty list"),
    "empty messages": ({"messages": []}, "not a nonempty list"),
    "message without role": ({"messages": [{"content": "hi"}]}, "message 0 has no 'role'"),
    "unknown role": (
        {"messages": [{"role": "narrator", "content": "hi"}]},
        "message 0 has unknown role 'narrator'",
    ),
    "template raises": (
        {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]},
        "Conversation roles must alternate",
    ),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_bad_conversations_are_errors(root, case):
    record, match = BAD_RECORDS[case]
    encoder = ChatEncoder(load_spec(_directory(root, "gemma3", False)))
    with pytest.raises(BadConversation, match=match):
        encoder.encode(record)


def test_an_assistant_message_with_no_trained_token_is_a_bad_conversation(root, tmp_path):
    """A span template that skips an assistant message's span: never an all-zero mask."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and m.content != 'skip' %}{% generation %}{{ m.content }}"
        "<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    encoder = ChatEncoder(load_spec(_directory(root, "qwen2_5", False), template))
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    assert encoder.encode(good).mask.sum() == 2
    bad = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "skip"}]}
    with pytest.raises(BadConversation, match="no trained token"):
        encoder.encode(bad)


DOCS_RECORD = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Colour?"},
        {"role": "assistant", "content": "Blue."},
    ]
}
DOCS_NAMES = {
    "llama3": "Llama 3",
    "qwen2_5": "Qwen 2.5",
    "gemma3": "Gemma 3",
    "qwen3": "Qwen 3",
    "phi3": "Phi-3",
}


def marked(encoder: ChatEncoder, record) -> str:
    """The rendered conversation with its trained tokens' characters between ⟦ and ⟧."""
    text, _ = encoder.render(record["messages"])
    mask = encoder.encode(record).mask
    pieces, position, inside = [], 0, False
    for (start, _), trained in zip(encoder.tokenize(text).offsets, mask, strict=True):
        if trained != inside:
            pieces += [text[position:start], "⟦" if trained else "⟧"]
            position, inside = start, trained
    return "".join([*pieces, text[position:], "⟧" if inside else ""])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_fine_tuning_docs_show_each_familys_mask_as_it_is(root, family):
    from pathlib import Path

    docs = (Path(__file__).parent.parent / "docs" / "fine-tuning.md").read_text()
    training = family not in MASKED
    which = "TRL's training template" if training else "stock template"
    encoder = ChatEncoder(load_spec(_directory(root, family, training)))
    block = f"{DOCS_NAMES[family]} ({which}):\n\n```text\n{marked(encoder, DOCS_RECORD)}\n```"
    assert block in docs
