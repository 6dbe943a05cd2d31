"""Special tokens: the roles a token can play (padding, start, end, ...) and their check against a vocabulary.

`Tokenizer` takes one keyword argument per role; this module checks those arguments and finds each
token's id, and registers the tokens as special with the wrapped `tokenizers.Tokenizer`.
"""

from keras_transformer.tokenizers.chat_template import SPECIAL_TOKEN_NAMES  # the roles, written once

__all__ = ["SPECIAL_TOKEN_NAMES", "check_special_token_names", "register_special_tokens"]


def check_special_token_names(special_tokens):
    """Raises a `ValueError` when `special_tokens` (a dict) has a key that is not a role above."""
    unknown = sorted(set(special_tokens) - set(SPECIAL_TOKEN_NAMES))
    if unknown:
        raise ValueError(f"Unknown special token argument(s) {unknown}; expected some of {list(SPECIAL_TOKEN_NAMES)}.")


def register_special_tokens(tokenizer, special_tokens, default_special_tokens):
    """Checks the special tokens against `tokenizer`'s vocabulary and registers them as special.

    Args:
        tokenizer: the `tokenizers.Tokenizer` whose vocabulary holds the tokens.
        special_tokens: role -> token string or None, as given to the constructor.
        default_special_tokens: role -> token string, for the roles `special_tokens` leaves out.

    Returns:
        `(tokens, ids)`: role -> token string (or None) and role -> id (or None), for every role.
    """
    tokens = {name: special_tokens.get(name, default_special_tokens.get(name)) for name in SPECIAL_TOKEN_NAMES}
    ids = {}
    for name, token in tokens.items():
        if token is None:
            ids[name] = None
            continue
        if not isinstance(token, str):
            raise ValueError(
                f"`{name}` must be a string or None. Received: {name}={token!r} of type {type(token).__name__}"
            )
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"`{name}` is not in the vocabulary of this tokenizer (pass {name}=None if it "
                f"has no such token). Received: {name}={token!r}"
            )
        ids[name] = token_id
    # Registering tokens that are already in the vocabulary keeps their ids. Tokens the file already declares
    # special keep their own flags (ModernBERT's and RoBERTa's mask token strips the space before it).
    declared = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    present = [t for t in dict.fromkeys(tokens.values()) if t is not None and t not in declared]
    if present:
        tokenizer.add_special_tokens(present)
    return tokens, ids
