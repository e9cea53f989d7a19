"""The Gemma comparison's held-out slices (data/multilingual_slice.jsonl, data/code_heldout.jsonl) are never
trained on: not in the corpus, not among the prompts the corpus is built from, not from the same seeds or
packages; and they are what the issue asks for (languages, scripts, counts)."""

from __future__ import annotations

import json

import pytest
from helpers import REPO, load_script

from hf_dynaspec.targets import PROMPT_FORMATS
from hf_dynaspec.training.corpus import prompt_key

languages = load_script(REPO / "recipes/gemma3/languages.py", "languages")
multilingual = load_script(REPO / "recipes/gemma3/multilingual.py", "multilingual")
code_prompts = load_script(REPO / "recipes/gemma3/code_prompts.py", "code_prompts")

DATA = REPO / "data"


def rows(name: str) -> list[dict]:
    path = DATA / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def corpus_keys() -> set[str]:
    index = json.loads((DATA / "corpus/gemma3/index.json").read_text())
    return set(index["done"])


def formatted_keys(prompt: str) -> set[str]:
    """Keys of `prompt` in every format the corpus asks questions in (the English ones and each language's)."""
    formats = [*PROMPT_FORMATS.values(), *(spec["qa"] for spec in languages.LANGUAGES.values())]
    return {prompt_key(fmt.format(prompt=prompt)) for fmt in formats}


def test_every_language_has_a_slice_of_its_own_text():
    slice_rows = rows("multilingual_slice.jsonl")
    non_latin = [c for c, v in languages.LANGUAGES.items() if v["script"] != "latin"]
    assert len(languages.LANGUAGES) >= 9 and len(non_latin) >= 4
    for code in languages.LANGUAGES:
        mine = [r for r in slice_rows if r["category"] == f"lang-{code}"]
        assert len(mine) >= 12, code
        assert all(languages.in_language(r["prompt"], code) for r in mine), code
    assert len({r["question_id"] for r in slice_rows}) == len(slice_rows)


def test_language_slices_are_held_out_of_the_corpus():
    slice_rows, done = rows("multilingual_slice.jsonl"), corpus_keys()
    questions = {r["prompt"] for r in rows("corpus/gemma3/" + multilingual.QUESTIONS_NAME)}
    assert slice_rows and questions
    for row in slice_rows:
        code = row["category"].removeprefix("lang-")
        assert multilingual.is_reserved(row["seed"]), row["question_id"]
        assert not formatted_keys(row["prompt"]) & done, row["question_id"]  # never answered into the corpus
        assert prompt_key(languages.few_shot_prompt(row["seed"], code)) not in done  # its seed never translated
        assert row["prompt"] not in questions


def test_reserved_seeds_never_reach_the_translation_stage():
    records = multilingual.translate_records(seeds_per_language=50, seed=0)
    reserved = {languages.few_shot_prompt(s, c) for s in multilingual.english_seeds() if multilingual.is_reserved(s)
                for c in languages.LANGUAGES}
    assert reserved and not reserved & {r["prompt"] for r in records}


def test_code_slice_comes_from_packages_never_trained_on():
    held, train = rows("code_heldout.jsonl"), rows("code_prompts.jsonl")
    assert len(held) >= 30 and {r["category"] for r in held} >= {"code-python", "code-javascript", "code-c"}
    splits = {name: spec[3] for name, spec in code_prompts.PACKAGES.items()}
    held_packages = {r["package"].split("==")[0] for r in held}
    train_packages = {r["package"].split("==")[0] for r in train}
    assert held_packages and not held_packages & train_packages
    assert all(splits[p] == "heldout" for p in held_packages) and all(splits[p] == "train" for p in train_packages)
    done, train_text = corpus_keys(), "\n".join(r["prompt"] for r in train)
    for row in held:
        assert not formatted_keys(row["prompt"]) & done
        head = "\n".join([ln for ln in row["prompt"].splitlines() if ln.strip()][-3:])  # its last 3 lines
        assert head not in train_text, row["question_id"]
    gpteacher = {json.loads(line)["prompt"] for line in (DATA / "code_slice.jsonl").read_text().splitlines()}
    assert not gpteacher & {r["prompt"] for r in held}  # another source than the earlier code slice


@pytest.mark.parametrize("text, code, expected", [
    ("一周有几天？", "zh", True), ("一週間は何日ありますか？", "zh", False), ("一週間は何日ありますか？", "ja", True),
    ("Сколько дней в неделе?", "ru", True), ("How many days are there in a week?", "de", False),
    ("Wie viele Tage hat eine Woche?", "de", True), ("कितने दिन", "hi", True), ("كم يومًا", "hi", False),
])
def test_language_check(text, code, expected):
    assert languages.in_language(text, code) is expected


def test_translations_drop_loops_examples_and_other_languages():
    answer = "Combien de tonnes de tonnes de tonnes de fer ?\nEnglish: x\nFrench: Où est la gare ?\n" \
             "French: Écris un court poème sur la mer.\nFrench: Where is the station?"
    assert multilingual.translations(answer, "fr") == ["Où est la gare ?"]


def test_question_lists_are_read_back_per_language():
    prompt = languages.question_list_prompt(["Где вокзал?", "Сколько стоит билет?", "Когда поезд?"], "ru")
    assert multilingual.language_of(prompt) == ("ru", "list")
    assert multilingual.language_of(languages.few_shot_prompt("Where is it?", "ja")) == ("ja", "translate")
    assert multilingual.language_of("Question: hi\nAnswer:") is None
    answer = " Почему небо голубое?\n5. Где живут медведи?\n6. Where do bears live?\nNot an item"
    assert multilingual.listed(answer, "ru") == ["Почему небо голубое?", "Где живут медведи?"]


def test_each_question_is_asked_three_ways():
    records = multilingual.answer_records([{"prompt": "Wie spät ist es?", "language": "de"}])
    assert [r["source"] for r in records] == ["plain-de", "qa-de", "local-de"]
    assert records[2]["prompt"] == "Frage: Wie spät ist es?\nAntwort:"
