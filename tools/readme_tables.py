"""Print the README's preset table, generated from the registry (tests/test_readme.py keeps them equal).

python tools/readme_tables.py
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")


def preset_table():
    from keras_transformer.presets import list_presets

    lines = ["| preset | family | parameters | weights | description |", "|---|---|---:|---|---|"]
    for row in list_presets():
        count = f"{row['parameter_count'] / 1e6:.1f}M" if row["parameter_count"] else "?"
        weights = "trained" if row["trained"] else "random init"
        lines.append(f"| `{row['name']}` | {row['family']} | {count} | {weights} | {row['description']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(preset_table())
