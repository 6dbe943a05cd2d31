"""`Encoder`: texts (or text pairs) in, the encoder graph's outputs out, for encoder bundles (BERT tasks)."""

import os

import numpy as np

from bundle_files import open_session, read_json, read_tokenizer


class Encoder:
    """Run the graph of an encoder bundle (BERT tasks) on texts or text pairs.

    Texts are packed as BERT reads them: [CLS] a [SEP] (b [SEP]), segment ids 0 then 1,
    right-padded to the longest, with the model's own tokens in those roles (the bundle's
    preprocessor_config.json: RoBERTa's <s> and </s>); a masked LM's `mask_positions` are where its
    mask token is ([MASK], <mask>). The graph gets the inputs it declares, no others (ModernBERT's reads no
    segment ids).

    Args:
        bundle_dir: the bundle directory (defaults to the directory of this file).
        providers, num_threads: as `Generator`.

    Example:
    >>> # Needs a bundle, written by `classifier.export("out/bert_onnx", format="onnx")`: not run by the tests.
    >>> Encoder("out/bert_onnx")(["a good film"])["logits"].shape  # doctest: +SKIP
    (1, 2)
    """

    def __init__(self, bundle_dir=None, providers=None, num_threads=None):
        self.bundle_dir = os.path.abspath(bundle_dir or os.path.dirname(os.path.abspath(__file__)))
        self.bundle = read_json(os.path.join(self.bundle_dir, "bundle.json"))
        if self.bundle["kind"] != "encoder":
            raise ValueError(
                f"This bundle holds a {self.bundle['task']}: use `Generator`. Received: bundle_dir={bundle_dir!r}"
            )
        self.config = read_json(os.path.join(self.bundle_dir, "preprocessor_config.json"))
        self.session = open_session(
            os.path.join(self.bundle_dir, self.bundle["graphs"]["encoder"]["file"]), providers, num_threads
        )
        self.tokenizer = read_tokenizer(self.bundle_dir)
        if self.tokenizer is None:
            raise ValueError(
                f"Not a keras_transformer bundle: missing {os.path.join(self.bundle_dir, 'tokenizer.json')}"
            )

    def pack(self, texts, pairs=None):
        """Texts (and second segments) -> the graph's inputs {token_ids, segment_ids, padding_mask}, int64."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        pairs = None if pairs is None else ([pairs] if isinstance(pairs, str) else list(pairs))
        cls, sep, pad = self.config["cls_token_id"], self.config["sep_token_id"], self.config["pad_token_id"]
        rows = []
        for i, text in enumerate(texts):
            ids = [cls] + self._ids(text) + [sep]
            types = [0] * len(ids)
            if pairs is not None:
                second = self._ids(pairs[i]) + [sep]
                ids, types = ids + second, types + [1] * len(second)
            if len(ids) > self.config["max_length"]:
                raise ValueError(f"Text {i} has {len(ids)} tokens, more than max_length={self.config['max_length']}.")
            rows.append((ids, types))
        width = max(len(ids) for ids, _ in rows)
        feeds = {
            "token_ids": np.full((len(rows), width), pad, np.int64),
            "segment_ids": np.zeros((len(rows), width), np.int64),
            "padding_mask": np.zeros((len(rows), width), np.int64),
        }
        for i, (ids, types) in enumerate(rows):
            feeds["token_ids"][i, : len(ids)] = ids
            feeds["segment_ids"][i, : len(ids)] = types
            feeds["padding_mask"][i, : len(ids)] = 1
        return feeds

    def __call__(self, texts, pairs=None):
        """Texts -> {output name: array}: sequence_output (B, T, D), pooled_output (B, D), and the task's output:
        logits, or a TextEmbedder's embeddings (B, D)."""
        feeds = self.pack(texts, pairs)
        names = [i.name for i in self.session.get_inputs()]
        if "mask_positions" in names:
            mask_id = self.config.get("mask_token_id")
            if mask_id is None:  # a bundle written before the config named it
                mask_id = self.tokenizer.token_to_id("[MASK]")
            positions = [np.flatnonzero(row == mask_id) for row in feeds["token_ids"]]
            feeds["mask_positions"] = np.zeros((len(positions), max(1, max(len(p) for p in positions))), np.int64)
            for i, p in enumerate(positions):
                feeds["mask_positions"][i, : len(p)] = p
        outputs = [o.name for o in self.session.get_outputs()]
        return dict(zip(outputs, self.session.run(outputs, {n: feeds[n] for n in names})))

    def _ids(self, text):
        # No special tokens from the tokenizer's own post-processor (a Hugging Face BERT or RoBERTa tokenizer.json
        # has one): `pack` writes them, as the Keras preprocessor does.
        return self.tokenizer.encode(text, add_special_tokens=False).ids
