"""The rule-based user simulator: each rule of the module docstring with scripted agent texts."""

from hypothesis import given, settings
from hypothesis import strategies as st

from acl_lib.envs.usersim import STOP, THANKS_STOP, RuleUser, asking_sentences, auth_sentence

SCENARIO = {
    "request": "I want to cancel an order.",
    "auth": {"name": "Ann Lee", "zip": "12345"},
    "details": {"order": "#W123", "reason": "no longer needed", "payment_method": "gift card"},
    "confirm": "yes",
    "max_turns": 8,
}


def test_full_conversation_follows_the_rules():
    u = RuleUser(SCENARIO)
    assert u.first_message() == "I want to cancel an order."
    assert u.reply("Happy to help. Could you give me your name and zip code?") == (
        "My name is Ann Lee and my zip code is 12345."
    )
    assert u.reply("Thanks. Which order is it? What is the reason for cancelling?") == "#W123 no longer needed"
    assert u.reply("Which payment method should receive the refund?") == "gift card"
    assert u.reply("I will cancel #W123 for 'no longer needed'. Shall I proceed (yes/no)?") == "yes"
    assert u.reply("Done: order #W123 is cancelled. Anything else I can help with?") == THANKS_STOP
    assert u.stopped
    assert u.said[0] == "I want to cancel an order." and u.said[-1] == THANKS_STOP
    assert u.given == ["auth", "details:order", "details:reason", "details:payment_method", "confirm"]
    # after stopping the user only says STOP
    assert u.reply("Wait, one more question?") == STOP


def test_statements_ask_nothing():
    u = RuleUser(SCENARIO)
    u.first_message()
    # "confirm", "order" and "email" appear only in statements -> the user is done
    assert u.reply("I can confirm your order was cancelled and an email was sent.") == THANKS_STOP


def test_auth_variants_and_repeat():
    assert auth_sentence({"email": "a@b.com"}) == "My email is a@b.com."
    assert auth_sentence({"user_id": "ann_lee_1"}) == "My user id is ann_lee_1."
    u = RuleUser({"request": "hi", "auth": {"email": "a@b.com"}, "max_turns": 5})
    u.first_message()
    assert u.reply("Please verify your identity: what is your email?") == "My email is a@b.com."
    # asked again after giving it: the user repeats the auth sentence (rule 6)
    assert u.reply("Sorry, could you repeat your email?") == "My email is a@b.com."


def test_first_auth_beats_confirm():
    u = RuleUser(SCENARIO)
    u.first_message()
    assert u.reply("Can you confirm your full name and zip?").startswith("My name is Ann Lee")
    # once identified, "confirm" is a confirmation request
    assert u.reply("Can you confirm the cancellation?") == "yes"


def test_custom_confirm_and_keyword_forms():
    u = RuleUser({"request": "x", "confirm": "no", "details": {"new address": "1 Main St"}, "max_turns": 9})
    u.first_message()
    assert u.reply("Should I go ahead?") == "no"
    assert u.reply("What is the new_address you want?") == "1 Main St"
    assert u.reply("Please tell me the New Address once more.") == "1 Main St"


def test_max_turns_stops():
    u = RuleUser({"request": "go", "details": {"order": "#1"}, "max_turns": 3})
    assert u.first_message() == "go"
    assert u.reply("Which order?") == "#1"
    assert u.reply("Which order?") == "#1"
    assert u.reply("Which order?") == STOP  # 3 user messages already said
    assert len(u.said) == 4 and u.stopped


def test_asking_sentences():
    assert asking_sentences("Done. Anything else?\nPlease confirm (yes/no)") == [
        "Anything else?",
        "Please confirm (yes/no)",
    ]
    assert asking_sentences("All set.") == []
    # question words count without a question mark; a statement starting like one does not
    assert asking_sentences("What is your user id. Tell me the order") == ["What is your user id.", "Tell me the order"]
    assert asking_sentences("Whatever you need, I did it.") == []


def test_reply_before_first_message_and_bad_input():
    u = RuleUser({"request": "hello"})
    assert u.reply(None) == THANKS_STOP  # type: ignore[arg-type]
    assert u.said[0] == "hello"
    assert RuleUser(None).first_message() == ""  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=12))
def test_never_raises_and_always_stops(texts):
    u = RuleUser(SCENARIO)
    u.first_message()
    for t in texts:
        out = u.reply(t)
        assert isinstance(out, str) and out
    # a user always ends within max_turns messages
    for _ in range(SCENARIO["max_turns"] + 1):
        u.reply("Which order? Shall I proceed?")
    first_stop = next(i for i, m in enumerate(u.said) if STOP in m)
    assert u.stopped and first_stop <= SCENARIO["max_turns"]
    assert all(m == STOP for m in u.said[first_stop + 1 :])
