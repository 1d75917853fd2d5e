"""relay: see the README. (Built in its own issue.)"""

__all__: list[str] = []
