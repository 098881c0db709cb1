"""Answer extraction per kind: what votes, what abstains, and GSM8K reference solutions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from blendserve.answers import canonical_key, extract
from blendserve.core.answers import KINDS, scan_boxes
from blendserve.core.answers import extract as core_extract

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She pays 5 + 7 = 12 dollars.\n#### 12", "12"),
        ("Total: <<2*500=1000>>1000\n#### 1,000", "1,000"),
        ("#### -3", "-3"),
        ("#### $1,234.50", "1,234.50"),
        ("#### 12\nsome trailing words 99", "12"),
        ("#### 5\nwait, recompute\n#### 7", "7"),
        ("He has 3 apples and 4 pears, so the answer is 7 fruits. Check: 7 = 3 + 4", "7"),
        ("The answer is: $18.", "18"),
        ("Answer: -2.5 degrees, from 10 and 12.5", "-2.5"),
        ("So in total \\boxed{42} cookies were sold on 3 days.", "42"),
        ("Thus \\boxed{\\$1,000} in total, for 4 people.", "1,000"),
        ("Hence \\boxed{x = 18}.", "18"),
        ("Then \\boxed{\\frac{3}{4}}", "3/4"),
        ("First 3 cats, then 8 dogs and finally 15 animals", "15"),
        ("It costs $25.", "25"),
        ("The change is 50%.", "50"),
        ("We get 5-3 which is 2", "2"),
        ("It drops to \u22124 degrees", "-4"),
        ("the digits 1,2,3 sum to 6", "6"),
        ("The ratio is 3/4", "3/4"),
        ("x is .5 of it", ".5"),
    ],
)
def test_number_extraction(text: str, expected: str) -> None:
    assert extract(text, "number") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I do not know.",
        "No digits here at all, sorry!",
        "We compute 2 + 3 and so the answer is \\boxed{5",  # truncated inside the box
    ],
)
def test_number_abstains(text: str) -> None:
    assert extract(text, "number") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("First \\boxed{3} then, correcting, \\boxed{4}.", "4"),
        ("\\boxed{\\boxed{7}}", "7"),
        ("Nested braces: \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("Set: \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("Use fbox: \\fbox{12}", "12"),
        ("spaced \\boxed {5}", "5"),
        ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
        ("The final answer is 12.", "12"),
        ("final answer: \\(x^2+1\\)", "x^2+1"),
        ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
        ("The answer is \\boxed{(1, 2)} and not (2, 1).", "(1, 2)"),
    ],
)
def test_math_extraction(text: str, expected: str) -> None:
    assert extract(text, "math") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The value is 5 but no box.",  # math does not read numbers out of reasoning
        "so it is \\boxed{\\frac{1}{2}",  # truncated: unclosed last box
        "first \\boxed{3}, then finally \\boxed{4",  # the last box is open: abstain
        "\\boxed{}",
        "the answer is 4",  # "answer is" alone is not a final answer for math
    ],
)
def test_math_abstains(text: str) -> None:
    assert extract(text, "math") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Reasoning...\nAnswer: (C)", "C"),
        ("Answer: B", "B"),
        ("The correct answer is D.", "D"),
        ("the answer is (b) because ...", "B"),
        ("I think the answer is option A.", "A"),
        ("Therefore, the correct option is **E**.", "E"),
        ("So we pick \\boxed{C}", "C"),
        ("So we pick \\boxed{\\text{(D)}}", "D"),
        ("Lots of reasoning.\n\nC", "C"),
        ("Lots of reasoning.\n**(J)**", "J"),
        ("Answer: A ... wait, no. Final answer: (B)", "B"),
        ("\\boxed{A} was wrong, the answer is C", "C"),
        ("The answer is C. A would be wrong.\nB", "B"),
        ("Answer:(H)", "H"),
    ],
)
def test_choice_extraction(text: str, expected: str) -> None:
    assert extract(text, "choice") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The answer is a tricky one.",  # lower-case article, not a letter choice
        "It must be Carbon",
        "Answer: K",  # outside A-J
        "I'm not sure between them.",
        "The answer is \\boxed{C",  # truncated
    ],
)
def test_choice_abstains(text: str) -> None:
    assert extract(text, "choice") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("we get \\boxed{0.5}", "0.5"),
        ("x\n#### 72", "72"),
        ("The answer is $\\dfrac{1}{2}$.", "\\dfrac{1}{2}"),
        ("answer is x = 3\nmore", "x = 3"),
        ("some 3 and then 4", "4"),
        ("nothing", None),
        ("\\boxed{3} ... \\boxed{", None),
    ],
)
def test_auto_extraction(text: str, expected: str | None) -> None:
    assert extract(text, "auto") == expected


@pytest.mark.parametrize(
    ("text", "pattern", "expected"),
    [
        ("Result = 42; other = 7", r"Result = (\d+)", "42"),
        ("ANSWER[  hello world ]", r"ANSWER\[(.*?)\]", "hello world"),
        ("no match here", r"ANSWER: (\w+)", None),
        ("value 17", r"\d+", "17"),  # no group: the whole match
        ("x: ", r"x:(\s*)", None),  # empty group abstains
    ],
)
def test_regex_extraction(text: str, pattern: str, expected: str | None) -> None:
    assert extract(text, "regex", pattern) == expected


def test_regex_needs_a_valid_pattern() -> None:
    with pytest.raises(ValueError, match="pattern"):
        extract("text", "regex")
    with pytest.raises(ValueError, match="invalid answer pattern"):
        extract("text", "regex", "(unclosed")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Paris  ", "Paris"),
        ("New\n  York\tCity ", "New York City"),
        ("   \n ", None),
    ],
)
def test_exact_extraction(text: str, expected: str | None) -> None:
    assert extract(text, "exact") == expected


@pytest.mark.parametrize("kind", ["Math", "numbers", "", "latex"])
def test_unknown_kind_is_named(kind: str) -> None:
    with pytest.raises(ValueError, match=repr(kind).replace("[", r"\[")):
        extract("5", kind)
    with pytest.raises(ValueError, match="unknown answer kind"):
        canonical_key("5", kind)


def test_kinds_are_the_documented_ones() -> None:
    assert set(KINDS) == {"auto", "number", "math", "choice", "regex", "exact"}


def test_core_extract_is_the_same_function_for_pure_kinds() -> None:
    text = "so \\boxed{\\frac{1}{2}} and #### 3"
    for kind in ("number", "math", "choice", "exact", "auto"):
        assert core_extract(text, kind) == extract(text, kind)


@pytest.mark.parametrize(
    ("text", "content", "unclosed"),
    [
        ("a \\boxed{1} b \\boxed{2}", "2", False),
        ("\\boxed{\\boxed{1}}", "\\boxed{1}", False),
        ("\\boxed{1} }}} stray", "1", False),
        ("\\boxed{1} \\boxed{2", None, True),
        ("\\boxed{ {1}", None, True),
        ("no box {here}", None, False),
    ],
)
def test_scan_boxes(text: str, content: str | None, unclosed: bool) -> None:
    scan = scan_boxes(text)
    assert (scan.content, scan.unclosed) == (content, unclosed)


def _jsonl(name: str) -> list[dict[str, object]]:
    with (FIXTURES / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_gsm8k_reference_solutions_extract_their_gold_answer() -> None:
    items = _jsonl("gsm8k_test_200.jsonl")
    assert len(items) == 200
    for item in items:
        solution = str(item["answer"])
        gold = solution.rsplit("####", 1)[1].strip()
        got = extract(solution, "number")
        assert got == gold, (gold, got)
        assert canonical_key(got, "number") == canonical_key(gold, "number")


def test_gsm8k_solutions_without_hashes_fall_back_to_the_last_number() -> None:
    # Reasoning alone (the "flexible" filter): the last number is the final result.
    hits = 0
    items = _jsonl("gsm8k_test_200.jsonl")
    for item in items:
        solution = str(item["answer"])
        reasoning, gold = solution.rsplit("####", 1)
        got = extract(reasoning, "number")
        hits += got is not None and canonical_key(got, "number") == canonical_key(gold, "number")
    assert hits >= 0.9 * len(items)
