"""A tiny but real cross-encoder in the Hugging Face / Optimum export layout, built for tests.

No reranker weights can be downloaded here, so the tests build one: an ONNX graph with the
inputs and outputs of an exported ``AutoModelForSequenceClassification`` (``input_ids``,
``attention_mask`` [, ``token_type_ids``] → ``logits``) and a ``tokenizer.json`` made with
the ``tokenizers`` library (WordLevel, BERT pair template ``[CLS] $A [SEP] $B [SEP]``).

Its weights make the score mean something: the logit of a (query, passage) pair is

    1.5 * (vocabulary words the passage shares with the query, counted min(q, p) times)
    + 3 * (occurrences of "relevant" in the passage) - 3 * ("irrelevant") - 2

computed inside the graph from a one-hot embedding, the segment of each token (its type id,
or, for a graph without token_type_ids, whether it comes after the first [SEP]) and the
attention mask. :func:`reference_logit` is the same formula in plain Python.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = (
    "relevant irrelevant ldap integration setup guide server address bind account backup "
    "backups daily kept thirty days vacation policy weather report today release notes "
    "sync groups fixed version how to the of a and is for open settings auth enter"
).split()
VOCAB = {token: i for i, token in enumerate(SPECIALS + WORDS)}
SEP_ID = VOCAB["[SEP]"]
SHARED_WEIGHT, BONUS, BIAS = 1.5, 3.0, -2.0


def build_tokenizer(max_length: int | None = None) -> Tokenizer:
    """The WordLevel tokenizer; ``max_length`` writes a truncation limit into it."""
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", SEP_ID)],
    )
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def build_graph(
    *,
    token_type_ids: bool = True,
    head: str = "n1",
    int_type: int = TensorProto.INT64,
    input_ids_name: str = "input_ids",
    hidden_output: bool = False,
    sequence: int | str = "sequence",
) -> onnx.ModelProto:
    """The scoring graph. ``head``: ``n1`` logits [batch, 1], ``n`` [batch], ``n2`` [batch, 2]
    (columns -logit/2 and logit/2, so softmax's positive column is sigmoid(logit)).
    ``hidden_output`` makes it an encoder without a classification head (output
    ``last_hidden_state`` [batch, seq, vocab]); ``input_ids_name`` renames that input;
    an int ``sequence`` fixes the inputs' length, as static-shape exports do."""
    v = len(VOCAB)
    content = np.array([0.0 if t in SPECIALS else 1.0 for t in VOCAB], dtype=np.float32)
    bonus = np.zeros((v, 1), dtype=np.float32)
    bonus[VOCAB["relevant"], 0] = BONUS
    bonus[VOCAB["irrelevant"], 0] = -BONUS
    inits = [
        numpy_helper.from_array(np.eye(v, dtype=np.float32), "onehot_table"),
        numpy_helper.from_array(content, "content"),
        numpy_helper.from_array(bonus, "bonus"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "axis1_scalar"),
        numpy_helper.from_array(np.array(SHARED_WEIGHT, dtype=np.float32), "shared_weight"),
        numpy_helper.from_array(np.array(BIAS, dtype=np.float32), "bias"),
        numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        numpy_helper.from_array(np.array(-0.5, dtype=np.float32), "minus_half"),
        numpy_helper.from_array(
            np.array(SEP_ID, dtype=helper.tensor_dtype_to_np_dtype(int_type)), "sep_id"
        ),
    ]
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Gather", ["onehot_table", input_ids_name], ["onehot"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=f),
    ]
    if token_type_ids:
        nodes.append(helper.make_node("Cast", ["token_type_ids"], ["seg_b"], to=f))
    else:  # segment B = after the first [SEP], as the pair template lays it out
        nodes += [
            helper.make_node("Equal", [input_ids_name, "sep_id"], ["is_sep_b"]),
            helper.make_node("Cast", ["is_sep_b"], ["is_sep"], to=f),
            helper.make_node("CumSum", ["is_sep", "axis1_scalar"], ["seps_so_far"]),
            helper.make_node("Sub", ["seps_so_far", "is_sep"], ["seps_before"]),
            helper.make_node("Greater", ["seps_before", "half"], ["after_b"]),
            helper.make_node("Cast", ["after_b"], ["seg_b"], to=f),
        ]
    nodes += [
        helper.make_node("Mul", ["seg_b", "maskf"], ["mask_b"]),
        helper.make_node("Sub", ["maskf", "mask_b"], ["mask_a"]),
        helper.make_node("Unsqueeze", ["mask_a", "axis2"], ["mask_a3"]),
        helper.make_node("Unsqueeze", ["mask_b", "axis2"], ["mask_b3"]),
        helper.make_node("Mul", ["onehot", "mask_a3"], ["onehot_a"]),
        helper.make_node("Mul", ["onehot", "mask_b3"], ["onehot_b"]),
        helper.make_node("ReduceSum", ["onehot_a", "axis1"], ["bag_a"], keepdims=0),
        helper.make_node("ReduceSum", ["onehot_b", "axis1"], ["bag_b"], keepdims=0),
        helper.make_node("Min", ["bag_a", "bag_b"], ["common"]),
        helper.make_node("Mul", ["common", "content"], ["common_words"]),
        helper.make_node("ReduceSum", ["common_words", "axis1"], ["shared"], keepdims=1),
        helper.make_node("Mul", ["shared", "shared_weight"], ["shared_term"]),
        helper.make_node("MatMul", ["bag_b", "bonus"], ["bonus_term"]),
        helper.make_node("Add", ["shared_term", "bonus_term"], ["raw"]),
        helper.make_node("Add", ["raw", "bias"], ["logit"]),
    ]
    batch_seq = ["batch", sequence]
    inputs = [
        helper.make_tensor_value_info(input_ids_name, int_type, batch_seq),
        helper.make_tensor_value_info("attention_mask", int_type, batch_seq),
    ]
    if token_type_ids:
        inputs.append(helper.make_tensor_value_info("token_type_ids", int_type, batch_seq))
    if hidden_output:
        output = helper.make_tensor_value_info("last_hidden_state", f, ["batch", sequence, v])
        nodes.append(helper.make_node("Identity", ["onehot"], ["last_hidden_state"]))
    elif head == "n1":
        output = helper.make_tensor_value_info("logits", f, ["batch", 1])
        nodes.append(helper.make_node("Identity", ["logit"], ["logits"]))
    elif head == "n":
        output = helper.make_tensor_value_info("logits", f, ["batch"])
        nodes.append(helper.make_node("Squeeze", ["logit", "axis1"], ["logits"]))
    elif head == "n2":
        output = helper.make_tensor_value_info("logits", f, ["batch", 2])
        nodes += [
            helper.make_node("Mul", ["logit", "minus_half"], ["negative"]),
            helper.make_node("Mul", ["logit", "half"], ["positive"]),
            helper.make_node("Concat", ["negative", "positive"], ["logits"], axis=1),
        ]
    else:
        raise ValueError(head)
    graph = helper.make_graph(nodes, "tiny_cross_encoder", inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write_model_dir(
    root: Path,
    *,
    model_file: str = "model.onnx",
    tokenizer_max_length: int | None = None,
    **graph: object,
) -> Path:
    """``root`` holding the graph at ``model_file`` and ``tokenizer.json``; returns ``root``.
    ``graph`` goes to :func:`build_graph`."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / model_file
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build_graph(**graph), str(target))  # type: ignore[arg-type]
    build_tokenizer(tokenizer_max_length).save(str(root / "tokenizer.json"))
    (root / "config.json").write_text(json.dumps({"architectures": ["TinyCrossEncoder"]}))
    return root


def _words(text: str) -> list[str]:
    return [w if w in VOCAB else "[UNK]" for w in re.findall(r"\w+|[^\w\s]+", text.lower())]


def reference_logit(query: str, passage: str) -> float:
    """The graph's logit, computed in Python (no truncation)."""
    q, p = _words(query), _words(passage)
    shared = sum(min(q.count(w), p.count(w)) for w in set(p) if w in WORDS)
    return SHARED_WEIGHT * shared + BONUS * (p.count("relevant") - p.count("irrelevant")) + BIAS


def reference_score(query: str, passage: str) -> float:
    """sigmoid(reference_logit)."""
    return float(1.0 / (1.0 + np.exp(-reference_logit(query, passage))))
