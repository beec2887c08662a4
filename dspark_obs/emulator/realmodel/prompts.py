"""Real prompts per workload for the real-model emulator (the demo and the test tier).

The traffic driver's default prompts are filler words, which a real model
answers with noise; these are short questions of the three workloads'
kinds: grade-school arithmetic (gsm8k), open questions (arena-hard) and
poems (poetry).  Each text starts with the workload tag so rids, prompts and
workload maps agree.
"""

from __future__ import annotations

PROMPTS: dict[str, tuple[str, ...]] = {
    "gsm8k": (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
        "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
        "What is 17 times 23? Explain step by step.",
        "Tom has 5 apples and buys 3 bags with 4 apples each. How many apples does he have now?",
    ),
    "arena-hard": (
        "Explain the difference between a process and a thread.",
        "Give three tips for learning a new language.",
        "What are the pros and cons of remote work?",
        "Describe how a refrigerator keeps food cold.",
        "Why is the sky blue? Answer briefly.",
        "Suggest a name for a small coffee shop and explain why.",
    ),
    "poetry": (
        "Write a short poem about the sea at night.",
        "Write a haiku about autumn leaves.",
        "Write a four-line poem about a cat in the sun.",
        "Write a short poem about the city waking up.",
        "Write a limerick about a forgetful robot.",
        "Write a short poem about rain on a window.",
    ),
}


def prompt_for(workload: str, index: int) -> str:
    """The ``index``-th prompt of ``workload`` (cycling), tagged ``[workload]``."""
    texts = PROMPTS.get(workload) or PROMPTS["arena-hard"]
    return f"[{workload}] {texts[index % len(texts)]}"
