# %% [markdown]
# # 3. Fine-tune a BERT classifier; evaluate; predict
#
# A `BertClassifier` is a BERT backbone with a classification head on the pooled `[CLS]` output.
# Starting from a pretrained preset is one line,
# `kt.models.BertClassifier.from_preset("bert_tiny", num_classes=2)` (a new head on the preset's
# backbone, with its WordPiece tokenizer); to stay within seconds on a CPU this notebook builds an
# even smaller one around a WordPiece vocabulary trained on the task's own sentences.
#
# We train it with plain `fit(texts, labels)` on a synthetic sentiment task in which "not" flips
# the label, so the model has to combine words rather than spot one keyword; then we evaluate on
# held-out sentences and predict new ones.
#
# Plots go to `$KT_EXAMPLES_OUT/03_bert_classifier/` (default `examples/out/`).

# %%
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import matplotlib.pyplot as plt
import numpy as np

import keras_transformer as kt

EXAMPLES = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()  # script | notebook
OUT = Path(os.environ.get("KT_EXAMPLES_OUT", EXAMPLES / "out")) / "03_bert_classifier"
OUT.mkdir(parents=True, exist_ok=True)
keras.utils.set_random_seed(0)
print("backend:", keras.config.backend())


def save(fig, name):
    fig.savefig(OUT / name, dpi=80, bbox_inches="tight")
    print("wrote", OUT / name)


# %% [markdown]
# ## A synthetic sentiment task
#
# "the film was great" is positive, "the film was not great" negative, "the film was not dull"
# positive. Train and held-out sentences are drawn independently; the held-out set is checked to
# share no sentence with the training set.

# %%
SUBJECTS = [
    "the film",
    "the movie",
    "the plot",
    "the acting",
    "the music",
    "the ending",
    "the book",
    "the dinner",
    "the service",
    "the hotel",
    "this show",
    "the game",
]
POSITIVE = ["good", "great", "wonderful", "excellent", "lovely", "brilliant", "fun", "superb"]
NEGATIVE = ["bad", "awful", "boring", "terrible", "dull", "poor", "weak", "dreadful"]
INTENSIFIERS = ["", "really ", "quite ", "very ", "rather "]
TEMPLATES = [
    "{s} was {n}{i}{a}",
    "i thought {s} was {n}{i}{a}",
    "honestly {s} is {n}{i}{a}",
    "{s} felt {n}{i}{a} to me",
]
CLASSES = ["negative", "positive"]


def sentences(rng, count):
    texts, labels = [], []
    for _ in range(count):
        positive, negated = rng.integers(0, 2, 2)
        adjective = rng.choice(POSITIVE if positive else NEGATIVE)
        template = rng.choice(TEMPLATES)
        intensifier = rng.choice(INTENSIFIERS)
        texts.append(template.format(s=rng.choice(SUBJECTS), n="not " if negated else "", i=intensifier, a=adjective))
        labels.append(int(positive != negated))
    return texts, np.array(labels)


train_texts, train_labels = sentences(np.random.default_rng(0), 1920)
test_texts, test_labels = sentences(np.random.default_rng(1), 600)
keep = [i for i, text in enumerate(test_texts) if text not in set(train_texts)]
test_texts, test_labels = [test_texts[i] for i in keep], test_labels[keep]
for text, label in zip(train_texts[:4], train_labels[:4]):
    print(f"{CLASSES[label]:>8}: {text}")
print(f"{len(train_texts)} training and {len(test_texts)} unseen held-out sentences")

# %% [markdown]
# ## The classifier
#
# A WordPiece tokenizer trained on the training sentences, a two-layer backbone, and the
# preprocessor that packs `[CLS] text [SEP]` and pads to 16 tokens. The learning rate warms up
# over the first steps: a post-norm BERT trained with a large rate from the first step often
# stays at chance.

# %%
tokenizer = kt.tokenizers.WordPieceTokenizer.train(train_texts, vocabulary_size=200)
preprocessor = kt.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=16)
backbone = kt.models.BertBackbone(
    vocabulary_size=tokenizer.vocabulary_size,
    num_layers=2,
    num_heads=2,
    hidden_dim=64,
    intermediate_dim=128,
    max_sequence_length=32,
)
classifier = kt.models.BertClassifier(backbone, num_classes=2, preprocessor=preprocessor)
x, _, _ = preprocessor(train_texts[:1])
print("packed:", [tokenizer.id_to_token(int(i)) for i in x["token_ids"][0]])
EPOCHS, BATCH_SIZE = 8, 32
steps = EPOCHS * -(-len(train_texts) // BATCH_SIZE)
schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=1e-3, warmup_steps=steps // 10)
classifier.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01))
print(f"{classifier.count_params():,} parameters")

# %% [markdown]
# ## Fine-tuning with `fit` on raw strings
#
# The validation data is passed preprocessed: a tuple `(texts, labels)` of raw strings would be
# read as a text pair. The sizes are chosen so that every batch has the same shape (1920 = 60 x
# 32; the held-out set in one batch): on JAX and TensorFlow each new batch shape is one more
# compilation, which for a model this small costs more than the training steps.

# %%
validation_data = classifier.preprocessor(test_texts, test_labels)[:2]  # (x, y) arrays
history = classifier.fit(
    train_texts,
    train_labels,
    batch_size=BATCH_SIZE,
    epochs=EPOCHS,
    validation_data=validation_data,
    validation_batch_size=len(test_texts),
    verbose=2,
)

# %% [markdown]
# ## Evaluate
#
# `evaluate` reports the compiled metrics; the confusion matrix comes from `predict`'s logits.

# %%
results = classifier.evaluate(test_texts, test_labels, batch_size=len(test_texts), verbose=0, return_dict=True)
print(f"held-out loss {results['loss']:.3f}, accuracy {results['accuracy']:.1%}")
predicted = np.argmax(classifier.predict(test_texts, batch_size=len(test_texts), verbose=0), axis=-1)
confusion = np.zeros((2, 2), int)
np.add.at(confusion, (test_labels, predicted), 1)
print(confusion)
assert abs(np.mean(predicted == test_labels) - results["accuracy"]) < 1e-6

epochs = np.arange(1, len(history.history["loss"]) + 1)
fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.4))
left.plot(epochs, history.history["loss"], "o-", label="train")
left.plot(epochs, history.history["val_loss"], "s-", label="held-out")
left.set(xlabel="epoch", title="loss")
left.legend()
middle.plot(epochs, history.history["accuracy"], "o-", label="train")
middle.plot(epochs, history.history["val_accuracy"], "s-", label="held-out")
middle.set(xlabel="epoch", title="accuracy", ylim=(0.4, 1.02))
middle.legend()
right.imshow(confusion, cmap="Blues")
for (i, j), count in np.ndenumerate(confusion):
    right.text(j, i, count, ha="center", va="center")
right.set_xticks([0, 1], CLASSES)
right.set_yticks([0, 1], CLASSES)
right.set(xlabel="predicted", ylabel="true", title="held-out confusion matrix")
fig.tight_layout()
save(fig, "training_and_confusion.png")

# %% [markdown]
# ## Predict
#
# `predict` on raw strings returns logits (B, 2); a softmax turns them into probabilities.

# %%
new = [
    "the soundtrack was not boring",
    "the soundtrack was boring",
    "i thought the museum was superb",
    "honestly the museum is not superb",
]
probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(classifier.predict(new, verbose=0)))
for text, p in zip(new, probabilities):
    print(f"{CLASSES[int(np.argmax(p))]:>8} ({p.max():.0%})  {text}")
