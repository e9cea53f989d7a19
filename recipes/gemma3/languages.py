"""The languages of the multilingual Gemma 3 corpus: their names, few-shot translation examples (our own
translations of three English sentences), the question / answer format in their own words ("qa") and a check
that a text is written in a given language.

`GROUPS` names the corpus sources of each language, of code and of English (everything else), as regular
expressions for `hf-dynaspec features --sources`: one features folder per group, so training reports each.

`in_language(text, code)` reads the script for non-Latin languages (the share of letters in the language's
script; Japanese must hold kana, Chinese none) and, for Latin-script languages, counts common function words
of that language against English ones. It is a filter for Gemma's own translations, not a language identifier.

    python recipes/gemma3/languages.py check "Wie viele Tage hat eine Woche?"
    python recipes/gemma3/languages.py groups   # "name regex" per line, for run.sh
"""

from __future__ import annotations

import re
import sys
import unicodedata

# The English sentences every few-shot prompt translates, then each language's rendering of them.
ENGLISH_EXAMPLES = (
    "How many days are there in a week?",
    "Write a short poem about the sea.",
    "Explain why the sky is blue.",
)

LANGUAGES: dict[str, dict] = {
    "zh": {"name": "Chinese", "script": "han", "qa": "问题：{prompt}\n回答：",
           "examples": ("一周有几天？", "写一首关于大海的短诗。", "解释一下为什么天空是蓝色的。")},
    "ja": {"name": "Japanese", "script": "japanese", "qa": "質問：{prompt}\n回答：",
           "examples": ("一週間は何日ありますか？", "海についての短い詩を書いてください。", "空が青い理由を説明してください。")},
    "ko": {"name": "Korean", "script": "hangul", "qa": "질문: {prompt}\n답변:",
           "examples": ("일주일은 며칠입니까?", "바다에 관한 짧은 시를 써 주세요.", "하늘이 왜 파란지 설명해 주세요.")},
    "ru": {"name": "Russian", "script": "cyrillic", "qa": "Вопрос: {prompt}\nОтвет:",
           "examples": ("Сколько дней в неделе?", "Напиши короткое стихотворение о море.",
                        "Объясни, почему небо голубое.")},
    "ar": {"name": "Arabic", "script": "arabic", "qa": "سؤال: {prompt}\nجواب:",
           "examples": ("كم يومًا في الأسبوع؟", "اكتب قصيدة قصيرة عن البحر.", "اشرح لماذا السماء زرقاء.")},
    "hi": {"name": "Hindi", "script": "devanagari", "qa": "प्रश्न: {prompt}\nउत्तर:",
           "examples": ("एक सप्ताह में कितने दिन होते हैं?", "समुद्र के बारे में एक छोटी कविता लिखिए।",
                        "समझाइए कि आसमान नीला क्यों होता है।")},
    "es": {"name": "Spanish", "script": "latin", "qa": "Pregunta: {prompt}\nRespuesta:",
           "examples": ("¿Cuántos días tiene una semana?", "Escribe un poema corto sobre el mar.",
                        "Explica por qué el cielo es azul."),
           "words": "el la los las de que y en un una es por para con del se qué cómo cuál no su al lo"},
    "fr": {"name": "French", "script": "latin", "qa": "Question : {prompt}\nRéponse :",
           "examples": ("Combien de jours y a-t-il dans une semaine ?", "Écris un court poème sur la mer.",
                        "Explique pourquoi le ciel est bleu."),
           "words": "le la les de des du et en un une est que qui pour dans avec pas sur au vous il ce"},
    "de": {"name": "German", "script": "latin", "qa": "Frage: {prompt}\nAntwort:",
           "examples": ("Wie viele Tage hat eine Woche?", "Schreibe ein kurzes Gedicht über das Meer.",
                        "Erkläre, warum der Himmel blau ist."),
           "words": "der die das und ist ein eine nicht mit zu den von für auf sie es ich wie was im dem"},
    "pt": {"name": "Portuguese", "script": "latin", "qa": "Pergunta: {prompt}\nResposta:",
           "examples": ("Quantos dias tem uma semana?", "Escreva um poema curto sobre o mar.",
                        "Explique por que o céu é azul."),
           "words": "o os as de que e em um uma é para com do da não no na por como se dos das"},
}
KINDS = ("translate", "list", "plain", "qa", "local")  # the source prefixes of multilingual.py's records
_LANGUAGE_SOURCE = f"({'|'.join(KINDS)})-({'|'.join(LANGUAGES)})"
GROUPS = {
    "en": f"(?!{_LANGUAGE_SOURCE}$)(?!code-).*",  # the English corpus (build_corpus.py), older shards' "" too
    **{code: f"({'|'.join(KINDS)})-{code}" for code in LANGUAGES},
    "code": "code-.*",
}


def group_of(source: str) -> str:
    """The group (`GROUPS`) a corpus source belongs to."""
    return next(name for name, pattern in GROUPS.items() if re.fullmatch(pattern, source))


ENGLISH_WORDS = set("the and is of to in a that for with what how you are this it be on your".split())

# Unicode ranges of each non-Latin script (letters only are counted).
SCRIPTS = {
    "han": ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xF900, 0xFAFF)),
    "kana": ((0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF)),
    "hangul": ((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F)),
    "cyrillic": ((0x0400, 0x04FF),),
    "arabic": ((0x0600, 0x06FF), (0x0750, 0x077F), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "devanagari": ((0x0900, 0x097F),),
}


def in_script(char: str, script: str) -> bool:
    return any(lo <= ord(char) <= hi for lo, hi in SCRIPTS[script])


def script_share(text: str, *scripts: str) -> float:
    """Share of the letters (and combining marks) of `text` that belong to any of `scripts`."""
    letters = [c for c in text if c.isalpha() or unicodedata.category(c).startswith("M")]
    if not letters:
        return 0.0
    return sum(any(in_script(c, s) for s in scripts) for c in letters) / len(letters)


def word_hits(text: str, words: set[str]) -> int:
    return sum(w in words for w in re.findall(r"\w+", text.lower()))


def in_language(text: str, code: str, min_share: float = 0.6) -> bool:
    """Whether `text` reads as language `code` (see the module docstring)."""
    script = LANGUAGES[code]["script"]
    if script == "han":
        return script_share(text, "han") >= min_share and script_share(text, "kana") == 0
    if script == "japanese":
        return script_share(text, "han", "kana") >= min_share and script_share(text, "kana") > 0.1
    if script != "latin":
        return script_share(text, script) >= min_share
    latin = [c for c in text if c.isalpha()]
    if not latin or sum(ord(c) < 0x250 for c in latin) / len(latin) < 0.9:
        return False
    hits = word_hits(text, set(LANGUAGES[code]["words"].split()))
    return hits >= 1 and hits > word_hits(text, ENGLISH_WORDS)


def few_shot_prompt(english: str, code: str) -> str:
    """The translation prompt a base model continues: three example pairs, then `english` to translate."""
    name = LANGUAGES[code]["name"]
    pairs = zip(ENGLISH_EXAMPLES, LANGUAGES[code]["examples"])
    return "".join(f"English: {en}\n{name}: {tr}\n\n" for en, tr in pairs) + f"English: {english}\n{name}:"


def question_list_prompt(questions: list[str], code: str) -> str:
    """A numbered list of questions in language `code` for a base model to go on with: its next items are new
    questions in that language (the given ones steer their topics)."""
    heading = f"Questions in {LANGUAGES[code]['name']}:\n"
    return heading + "".join(f"{i}. {q}\n" for i, q in enumerate(questions, start=1)) + f"{len(questions) + 1}."


if __name__ == "__main__":
    if sys.argv[1:2] == ["groups"]:
        print("\n".join(f"{name} {pattern}" for name, pattern in GROUPS.items()))
    elif sys.argv[1:2] == ["check"]:
        text = " ".join(sys.argv[2:])
        print({code: in_language(text, code) for code in LANGUAGES})
    else:
        raise SystemExit(__doc__)
