"""`PrefixCache`: the keys/values of recent prompts' prefixes, in blocks of `block_size` tokens, for the server's
scheduler (batching.py): a prompt that starts with stored blocks copies them and prefills only the rest.

Axes: L layers, Hkv key/value heads, Dh head size, S prompt length, P a matched prefix's length, K block size.

A block is the keys and values of K consecutive prompt positions, (2L, Hkv, K, Dh), stored under its tokens
and the block before it: (parent block's id, its K token ids), so a block is found only after the very
prefix it was computed with (a position's keys/values depend on every token before it, and on nothing
after: a causal LM's). Only whole blocks are stored. The store holds at most `max_tokens // K` blocks and
evicts the least recently used; a prompt's blocks are marked used from its last to its first, so a prefix
outlives its continuations. A block whose parent was evicted can no longer be reached and goes in turn.
"""

import collections

import numpy as np

__all__ = ["PrefixCache"]


class PrefixCache:
    """Block-granular store of prompt prefixes' keys/values, LRU-evicted under a budget of tokens.

    Args:
        max_tokens: int >= 0, the most positions held (0: nothing is stored).
        block_size: int >= 1, positions per block (K).

    Example:
    >>> cache = PrefixCache(max_tokens=64, block_size=4)
    >>> kv = [np.random.rand(2, 9, 8).astype(np.float32) for _ in range(4)]  # 2 layers: keys, values (Hkv, S, Dh)
    >>> cache.store(list(range(9)), kv)
    >>> length, past = cache.lookup(list(range(8)) + [42, 43])
    >>> length, past[0].shape, bool(np.array_equal(past[3], kv[3][:, :8]))
    (8, (2, 8, 8), True)
    """

    def __init__(self, max_tokens, block_size=16):
        for name, value, least in (("max_tokens", max_tokens, 0), ("block_size", block_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"`{name}` must be an int >= {least}. Received: {name}={value!r}")
        self.block_size, self.max_blocks = block_size, max_tokens // block_size
        self._blocks = collections.OrderedDict()  # (parent id, K tokens) -> (id, (2L, Hkv, K, Dh)); oldest first
        self._next_id = 0
        self.hits = self.hit_tokens = 0

    def __len__(self):
        """Blocks held."""
        return len(self._blocks)

    def first_key(self, tokens):
        """The key of a prompt's first block (None when it has no whole block before its last token): two prompts
        with the same first key share at least one block."""
        return (-1, tuple(tokens[: self.block_size])) if len(tokens) > self.block_size else None

    def lookup(self, tokens):
        """The longest stored prefix of `tokens` in whole blocks, leaving at least its last token to run ->
        (P, 2L arrays (Hkv, P, Dh), keys and values of each layer; None when P = 0)."""
        chain = self._chain(tokens, (len(tokens) - 1) // self.block_size)
        if not chain:
            return 0, None
        self._touch(chain)
        self.hits, self.hit_tokens = self.hits + 1, self.hit_tokens + len(chain) * self.block_size
        past = np.concatenate([data for _, (_, data) in chain], axis=2)  # (2L, Hkv, K, Dh) x n -> (2L, Hkv, P, Dh)
        return past.shape[2], list(past)

    def store(self, tokens, keys_values):
        """Store the whole blocks of a prompt: `tokens` (S ids) and its positions' `keys_values`, 2L arrays
        (Hkv, >= S, Dh) (each layer's keys, then values). Blocks held already are only marked used."""
        K = self.block_size
        count = min(len(tokens) // K, self.max_blocks)
        chain = self._chain(tokens, count)
        self._touch(chain)  # the newest: the evictions below take other blocks
        parent = chain[-1][1][0] if chain else -1
        for j in range(len(chain), count):
            key = (parent, tuple(tokens[j * K : (j + 1) * K]))
            if len(self._blocks) >= self.max_blocks:
                self._blocks.popitem(last=False)
            data = np.stack([array[:, j * K : (j + 1) * K] for array in keys_values])  # (2L, Hkv, K, Dh)
            self._blocks[key] = block = (self._next_id, data)
            self._next_id += 1
            chain.append((key, block))
            parent = block[0]
        self._touch(chain)

    def _chain(self, tokens, count):
        """[(key, (id, data))] of the stored blocks of `tokens`' first `count` whole blocks, up to the first
        missing."""
        K, chain, parent = self.block_size, [], -1
        for j in range(count):
            key = (parent, tuple(tokens[j * K : (j + 1) * K]))
            block = self._blocks.get(key)
            if block is None:
                break
            chain.append((key, block))
            parent = block[0]
        return chain

    def _touch(self, chain):
        """Mark a chain used, its last block first: its first block becomes the most recent."""
        for key, _ in reversed(chain):
            self._blocks.move_to_end(key)
