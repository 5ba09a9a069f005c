"""Decisions: health tuples -> lifecycle transitions and intents (pure), and the per-cycle loop.

Entry points: ``decide.decider.Decider`` / ``decide.decider.decide`` (one pure cycle),
``decide.loop.DecisionLoop`` (history -> score -> decide -> persist, shared by replay and the controller),
``decide.lifecycle`` (the transition table and its Mermaid rendering).
"""
