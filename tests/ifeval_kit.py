"""One set of arguments for every IFEval verifier, for the tests that call each verifier on many texts (the
fuzz tests: never raise, stay within a time bound). Each string argument carries a regular-expression
metacharacter (``(``, ``[``, ``+``) so that a verifier building a pattern from it without escaping fails."""

from __future__ import annotations

KWARGS: dict[str, dict] = {
    "keywords:existence": {"keywords": ["plan(", "x"]},
    "keywords:frequency": {"keyword": "[plan", "frequency": 2, "relation": "at least"},
    "keywords:forbidden_words": {"forbidden_words": ["bad", "x+"]},
    "keywords:letter_frequency": {"letter": "a", "let_frequency": 3, "let_relation": "less than"},
    "language:response_language": {"language": "en"},
    "length_constraints:number_sentences": {"num_sentences": 3, "relation": "at least"},
    "length_constraints:number_paragraphs": {"num_paragraphs": 3},
    "length_constraints:number_words": {"num_words": 30, "relation": "less than"},
    "length_constraints:nth_paragraph_first_word": {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "so"},
    "detectable_content:postscript": {"postscript_marker": "P.(S"},
    "detectable_content:number_placeholders": {"num_placeholders": 3},
    "detectable_format:number_bullet_lists": {"num_bullets": 3},
    "detectable_format:number_highlighted_sections": {"num_highlights": 2},
    "detectable_format:multiple_sections": {"section_spliter": "Sec(tion", "num_sections": 2},
    "change_case:capital_word_frequency": {"capital_frequency": 2, "capital_relation": "at least"},
    "startend:end_checker": {"end_phrase": "Any other questions?"},
    "combination:repeat_prompt": {"prompt_to_repeat": "Write a poem"},
    "count:word_count_range": {"min_words": 1, "max_words": 50},
    "count:unique_word_count": {"N": 3},
    "ratio:stop_words": {"percentage": 50},
    "count:conjunctions": {"small_n": 2},
    "count:person_names": {"N": 1},
    "count:numbers": {"N": 2},
}
