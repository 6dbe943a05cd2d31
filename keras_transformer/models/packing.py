"""Packing whole documents into causal-LM training windows, so documents of any length train.

Axes: N windows, T = sequence_length.

The usual recipe for language-model training on documents longer than the model's window:
concatenate the documents (each framed by its start/end tokens) into one stream of ids and cut
the stream into windows of T + 1 ids. Consecutive windows overlap by one id: window k holds
stream[k*T : k*T + T + 1], its inputs are the first T ids and its labels the last T. So every
id of the stream after the first is a label exactly once, and an input exactly once (the last
id only closes the last window). The last window is right-padded (padding mask False, weight 0)
instead of dropped, so no token is lost.

A window may hold the end of one document and the start of the next; attention is causal over
the whole window (as in GPT-2's training), and the end/start tokens between documents tell the
model where one stops.
"""

import numpy as np


def pack_documents(documents, sequence_length, pad_token_id=0, document_weights=None):
    """Id lists (whole documents, framing tokens included) -> causal-LM training windows.

    Args:
        documents: a list of id lists, one per document, in order (a document may be longer
            than `sequence_length`; empty documents add nothing).
        sequence_length: int >= 1, T, the model's input length.
        pad_token_id: int, the id written in the padded tail of the last window.
        document_weights: None, or one float per document: each label is weighted by the
            weight of the document it belongs to.

    Returns:
        `({"token_ids": (N, T) int32, "padding_mask": (N, T) bool}, labels (N, T) int32,
        sample_weight (N, T) float32)`, N = ceil((total ids - 1) / T) (0 rows when the
        documents hold fewer than 2 ids): what `fit` takes as `x, y, sample_weight`.

    Example:
    >>> x, y, w = pack_documents([[1, 5, 6, 2], [1, 7, 2]], sequence_length=3)
    >>> x["token_ids"].tolist(), y.tolist(), w.tolist()
    ([[1, 5, 6], [2, 1, 7]], [[5, 6, 2], [1, 7, 2]], [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    """
    if not isinstance(sequence_length, int) or isinstance(sequence_length, bool) or sequence_length < 1:
        raise ValueError(f"`sequence_length` must be an int >= 1. Received: sequence_length={sequence_length!r}")
    lengths = [len(document) for document in documents]
    stream = np.fromiter((int(i) for document in documents for i in document), dtype="int32", count=sum(lengths))
    if document_weights is None:
        weights = np.ones(len(stream), "float32")
    else:
        document_weights = np.asarray(document_weights, dtype="float32")
        if document_weights.shape != (len(documents),):
            raise ValueError(
                f"`document_weights` needs one weight per document ({len(documents)}). "
                f"Received: shape={document_weights.shape}"
            )
        weights = np.repeat(document_weights, lengths)  # the weight of each id's document
    num_windows = max(0, -(-(len(stream) - 1) // sequence_length))  # ceil((L - 1) / T)
    # Window k reads stream[k*T : k*T + T + 1]; pad the stream so the last window is whole.
    padded_length = num_windows * sequence_length + 1
    ids = np.full(padded_length, pad_token_id, dtype="int32")
    real = np.zeros(padded_length, dtype=bool)
    label_weights = np.zeros(padded_length, dtype="float32")
    ids[: len(stream)], real[: len(stream)], label_weights[: len(stream)] = stream, True, weights
    starts = np.arange(num_windows)[:, None] * sequence_length  # (N, 1)
    inputs = starts + np.arange(sequence_length)[None]  # (N, T): positions of the inputs in the stream
    labels = inputs + 1  # (N, T): the next id of each input
    x = {"token_ids": ids[inputs], "padding_mask": real[inputs]}
    return x, ids[labels], np.where(real[labels], label_weights[labels], 0.0).astype("float32")
