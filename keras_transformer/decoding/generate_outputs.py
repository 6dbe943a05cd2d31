"""`generate`'s outputs: the loop's token buffers cut at each row's end, in the form the caller passed.

Axes: B inputs, R decoded rows, L token buffer length, V vocabulary, n results per input.
"""

import numpy as np


def cut_results(outputs, prompts, sampler, max_new_tokens, stop_ids):
    """The loop's numpy outputs -> (results, scores, logits): per input the prompt and its generated tokens up
    to and including the first stop token (n hypotheses per input for beam search, with their scores), and
    each generated token's logits where the loop kept them."""
    results, scores, logits = [], None, None
    if sampler.reorders_rows:
        scores = outputs["scores"]  # (B, n)
        n = sampler.num_return_sequences
        for row in range(len(prompts)):
            hypotheses = [outputs["token_ids"][row, k, : outputs["ends"][row, k]] for k in range(n)]  # (B, n, L)
            results.append(hypotheses if n > 1 else hypotheses[0])
        return results, scores, logits
    for row, prompt in enumerate(prompts):
        generated = outputs["token_ids"][row, len(prompt) : len(prompt) + max_new_tokens]  # (R, L)
        results.append(outputs["token_ids"][row, : len(prompt) + _stop_length(generated, stop_ids)])
    if "logits" in outputs:  # (R, L, V)
        logits = [outputs["logits"][row, len(p) : len(r)] for row, (p, r) in enumerate(zip(prompts, results))]
    return results, scores, logits


def chosen_logprobs(results, prompts, logits):
    """Each row's generated tokens' log-probabilities (N,) float32: the log-softmax of the raw logits the loop
    kept (before temperature, top-k/top-p and logits processors), at the token chosen; None without logits."""
    if logits is None:
        return None
    chosen = []
    for result, prompt, row_logits in zip(results, prompts, logits):
        row_logits = np.asarray(row_logits, np.float64)  # (N, V)
        peak = row_logits.max(axis=-1, keepdims=True)
        log_total = np.log(np.exp(row_logits - peak).sum(axis=-1)) + peak[:, 0]  # (N,)
        tokens = np.asarray(result[len(prompt) :], np.int64)  # (N,)
        chosen.append((row_logits[np.arange(tokens.size), tokens] - log_total).astype(np.float32))
    return chosen


def _stop_length(generated, stop_ids):
    """Number of generated tokens kept: up to and including the first stop token."""
    if stop_ids:
        hits = np.flatnonzero(np.isin(generated, stop_ids))
        if hits.size:
            return int(hits[0]) + 1
    return len(generated)


def format_results(task, form, results, num_return_sequences, pad_id):
    """Id rows -> the caller's form: strings for strings, arrays for arrays, lists for lists."""
    nested = num_return_sequences > 1
    flat = [r for group in results for r in group] if nested else results
    if form in ("string", "strings"):
        out = task.preprocessor.generate_postprocess([np.asarray(r) for r in flat])
    elif form in ("list1d", "list2d"):
        out = [np.asarray(r).astype(int).tolist() for r in flat]
    else:
        width = max(len(r) for r in flat)
        out = np.full((len(flat), width), pad_id, "int32")
        for i, r in enumerate(flat):
            out[i, : len(r)] = r
    if nested:
        n = num_return_sequences
        out = (
            out.reshape(len(results), n, -1)
            if isinstance(out, np.ndarray)
            else [out[i : i + n] for i in range(0, len(out), n)]
        )
    if form in ("string", "list1d", "array1d"):
        return out[0]
    return out
