"""How a message names an optional extra to install: from the index, and from a clone.

``pip install 'tokstream[torch]'`` fails for a package installed from a clone of the repository
(pip then looks the name up on the index); such a user needs ``pip install '.[torch]'`` in the
clone. Every message that suggests an extra says both.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """``pip install 'tokstream[EXTRA]'``, and the command for a clone.

    >>> install_hint("torch")
    "pip install 'tokstream[torch]' (in a clone of the repository: pip install '.[torch]')"
    """
    return (
        f"pip install 'tokstream[{extra}]' (in a clone of the repository: pip install '.[{extra}]')"
    )
