"""`Encoder`: texts (or text pairs) in, the encoder graph's outputs out, for encoder bundles (BERT-style tasks and
TextEmbedders)."""

import os

import numpy as np

from bundle_files import open_session, read_json, read_tokenizer


class Encoder:
    """Run the graph of an encoder bundle (BERT-style tasks, TextEmbedders) on texts or text pairs.

    Texts are packed by the bundle's tokenizer.json where its template (post-processor) adds special tokens, as
    `transformers`' tokenizer packs them: BERT's [CLS] a [SEP] b [SEP] with segment ids 0 then 1, RoBERTa's
    <s> a </s></s> b </s>, ModernBERT's [CLS] a [SEP], Qwen3-Embedding's a <|endoftext|>. A tokenizer without one
    (those trained by keras_transformer) gets BERT's layout with the ids preprocessor_config.json names (none where
    it names none, as a decoder's). Rows are right-padded to the longest; a masked LM's `mask_positions` are where
    its mask token is ([MASK], <mask>). The graph gets the inputs it declares, no others (ModernBERT's and a
    decoder embedder's read no segment ids).

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
        rows = []
        for i, text in enumerate(texts):
            ids, types = self._encode(text, None if pairs is None else pairs[i])
            if len(ids) > self.config["max_length"]:
                raise ValueError(f"Text {i} has {len(ids)} tokens, more than max_length={self.config['max_length']}.")
            rows.append((ids, types))
        width = max(len(ids) for ids, _ in rows)
        feeds = {
            "token_ids": np.full((len(rows), width), self.config["pad_token_id"], np.int64),
            "segment_ids": np.zeros((len(rows), width), np.int64),
            "padding_mask": np.zeros((len(rows), width), np.int64),
        }
        for i, (ids, types) in enumerate(rows):
            feeds["token_ids"][i, : len(ids)] = ids
            feeds["segment_ids"][i, : len(ids)] = types
            feeds["padding_mask"][i, : len(ids)] = 1
        return feeds

    def _encode(self, text, pair=None):
        """(ids, segment ids) of one text, or of a pair: the tokenizer's template, else [CLS] a [SEP] (b [SEP])."""
        processor = self.tokenizer.post_processor
        if processor is not None and processor.num_special_tokens_to_add(pair is not None) > 0:
            encoding = self.tokenizer.encode(text, pair, add_special_tokens=True)
            return encoding.ids, encoding.type_ids
        start = [self.config["cls_token_id"]] if self.config.get("cls_token_id") is not None else []
        end = [self.config["sep_token_id"]] if self.config.get("sep_token_id") is not None else []
        ids = start + self._ids(text) + end
        types = [0] * len(ids)
        if pair is not None:
            second = self._ids(pair) + end
            ids, types = ids + second, types + [1] * len(second)
        return ids, types

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
        return self.tokenizer.encode(text, add_special_tokens=False).ids
