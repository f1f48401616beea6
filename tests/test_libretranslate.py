"""LibreTranslate's API on attnmt's server: its request shapes, routing by language pair,
detection, sentence splitting, HTML, API keys, and its clients from PyPI used unchanged."""
import html.parser
import sys

import pytest
from fastapi.testclient import TestClient

from attnmt.documents import join_sentences, parse_html, split_sentences
from attnmt.errors import UserError
from attnmt.libretranslate import ApiError, ApiKeys
from attnmt.serve import Limits, create_app
from attnmt.translator import Translator
from test_serve import free_port, start_server

GERMAN = "Ein Hund rennt durch den Schnee. Zwei Männer sitzen auf einer Bank."
FRENCH = "Un chien court dans la neige. Deux hommes sont assis sur un banc."


@pytest.fixture(scope="module")
def translators(tiny_runs, french_run):
    return {"de_en": Translator.from_run(tiny_runs["transformer"]),
            "fr_en": Translator.from_run(french_run)}


@pytest.fixture(scope="module")
def client(translators):
    with TestClient(create_app(translators, Limits(max_chars=100, max_work=200_000))) as client:
        yield client


def native(translators, name: str, texts: list[str], beam: int = 5) -> list[str]:
    return [t.best.text for t in translators[name].translate(texts, beam=beam)]


# --- documents ---------------------------------------------------------------------------

PARAGRAPHS = ("Dr. Müller kam um 9 Uhr.  Er trank Tee!\n\n"
              "Die Katze schläft. Der Hund bellt?\n\n\n"
              "  Ein Satz allein.\n"
              "Noch eine Zeile. Und noch ein Satz.\n\n"
              "Ende.\n")


def test_sentences_and_the_gaps_between_them_rebuild_the_text():
    sentences, gaps = split_sentences(PARAGRAPHS, "de")
    assert join_sentences(sentences, gaps) == PARAGRAPHS
    assert sentences == ["Dr. Müller kam um 9 Uhr.", "Er trank Tee!", "Die Katze schläft.",
                         "Der Hund bellt?", "Ein Satz allein.", "Noch eine Zeile.",
                         "Und noch ein Satz.", "Ende."]         # "Dr." does not end one
    assert gaps == ["", "  ", "\n\n", " ", "\n\n\n  ", "\n", " ", "\n\n", "\n"]
    assert split_sentences("", "de") == ([], [""]) and split_sentences(" \n ", "cs") == ([], [" \n "])
    # a language the splitter has no abbreviations for still splits (English rules)
    assert split_sentences("Ahoj. Jak se máš?", "xx")[0] == ["Ahoj.", "Jak se máš?"]


def test_czech_abbreviations_do_not_end_a_sentence():
    assert split_sentences("Přišel např. pan Novák. Pak odešel.", "cs")[0] == \
        ["Přišel např. pan Novák.", "Pak odešel."]


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


def structure(markup: str) -> list:
    """The document's tags with their attributes, in order, and its comments."""
    found = []

    class Parser(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append(("start", tag, attrs))

        def handle_endtag(self, tag):
            if tag not in VOID:                   # <br> and <br/> are the same element
                found.append(("end", tag))

        def handle_comment(self, data):
            found.append(("comment", data))

    Parser().feed(markup)
    return found


HTML = ('<!DOCTYPE html><html><head><title>Ein Hund</title><style>p { color: red }</style></head>'
        '<body><p class="a" data-x=\'1 &amp; 2\'>Ein Hund rennt. Zwei Männer <b>sitzen</b>.</p>'
        '<!-- ein Kommentar --><script>var x = "Ein Hund";</script><code>Ein Hund</code>'
        '<img src="hund.png" alt="Ein Hund"><br/>Text &amp; mehr</body></html>')


def test_html_text_nodes_skip_code_and_comments():
    document = parse_html(HTML)
    assert document.texts == ["Ein Hund", "Ein Hund rennt. Zwei Männer ", "sitzen", ".",
                              "Text & mehr"]
    assert [HTML[start:end] for start, end in document.spans][-1] == "Text &amp; mehr"


# --- the API -----------------------------------------------------------------------------

def test_json_form_and_query_requests_translate_alike(client, translators):
    answers = [client.post("/translate", json={"q": "Sieben. Dreihundertzwölf.", "source": "de",
                                               "target": "en"}),
               client.post("/translate", data={"q": "Sieben. Dreihundertzwölf.", "source": "de",
                                               "target": "en"}),
               client.post("/translate", params={"q": "Sieben. Dreihundertzwölf.", "source": "de",
                                                 "target": "en", "format": "text"}),
               client.post("/translate", files={"q": (None, "Sieben. Dreihundertzwölf."),
                                                "source": (None, "de"), "target": (None, "en")})]
    sentences = native(translators, "de_en", ["Sieben.", "Dreihundertzwölf."])
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"translatedText": " ".join(sentences)}


def test_a_list_of_texts_and_alternatives(client, translators):
    texts = ["Sieben.", "Acht."]
    answer = client.post("/translate", json={"q": texts, "source": "de", "target": "en",
                                             "alternatives": 2}).json()
    assert answer["translatedText"] == native(translators, "de_en", texts)
    for translation, alternatives in zip(translators["de_en"].translate(texts, beam=5, n_best=3),
                                         answer["alternatives"], strict=True):
        others = [h.text for h in translation.hypotheses[1:] if h.text != translation.best.text]
        assert alternatives == list(dict.fromkeys(others))


def test_the_language_pair_picks_the_model_and_auto_detects(client, translators):
    for text, lang in ((GERMAN, "de"), (FRENCH, "fr")):
        answer = client.post("/translate", json={"q": text, "source": "auto", "target": "en"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["detectedLanguage"]["language"] == lang
        assert 50 < body["detectedLanguage"]["confidence"] <= 100
        sentences, _ = split_sentences(text, lang)
        assert body["translatedText"] == " ".join(native(translators, f"{lang}_en", sentences))
    detected = client.post("/detect", data={"q": FRENCH}).json()
    assert [d["language"] for d in detected] == ["fr", "de"]
    assert detected[0]["confidence"] > detected[1]["confidence"]
    unserved = client.post("/translate", json={"q": "Hallo", "source": "de", "target": "fr"})
    assert unserved.status_code == 400
    assert unserved.json() == {"error": "no model translates de into fr; this server translates "
                                        "de->en, fr->en"}


def test_a_request_routed_to_several_models_is_budgeted_once(translators):
    # With source: auto, each model's share was checked against max_work alone, so a request
    # routed to N models could cost N x max_work.
    from attnmt.serve import Options, request_cost

    shares = {lang: request_cost(translators[f"{lang}_en"], split_sentences(text, lang)[0],
                                 Options(5, 1, None, False)).work
              for lang, text in (("de", GERMAN), ("fr", FRENCH))}
    limits = Limits(max_chars=100, max_work=max(shares.values()) + 1)
    with TestClient(create_app(translators, limits)) as client:
        for text in (GERMAN, FRENCH):
            alone = client.post("/translate", json={"q": text, "source": "auto", "target": "en"})
            assert alone.status_code == 200, alone.text
        both = client.post("/translate", json={"q": [GERMAN, FRENCH], "source": "auto",
                                               "target": "en"})
        assert both.status_code == 400 and f"> max_work {limits.max_work}" in both.json()["error"]


def test_languages_lists_the_served_pairs(client):
    assert client.get("/languages").json() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "fr", "name": "French", "targets": ["en"]}]
    settings = client.get("/frontend/settings").json()
    assert (settings["keyRequired"], settings["language"]["source"]["code"]) == (False, "de")


def test_a_one_to_many_model_serves_each_target(one_to_many_run):
    translator = Translator.from_run(one_to_many_run)
    with TestClient(create_app({"de_xx": translator})) as client:
        assert client.get("/languages").json() == [
            {"code": "de", "name": "German", "targets": ["en", "fr"]}]
        for lang in ("en", "fr"):
            answer = client.post("/translate", json={"q": "sieben", "source": "de", "target": lang})
            expected = translator.translate(["sieben"], beam=5, target_lang=lang)[0].best.text
            assert answer.json() == {"translatedText": expected}


def test_paragraphs_keep_their_layout(client, translators):
    text = "Sieben. Acht.\n\nNeun.\n\n\nZehn.  Elf.\n\nZwölf.\n\nDreizehn.\n"
    answer = client.post("/translate", json={"q": text, "source": "de", "target": "en"})
    sentences, gaps = split_sentences(text, "de")
    assert answer.json()["translatedText"] == join_sentences(native(translators, "de_en", sentences),
                                                             gaps)
    assert answer.json()["translatedText"].count("\n\n") == 4 and len(sentences) == 7


def test_html_keeps_every_tag_and_attribute(client, translators):
    answer = client.post("/translate", json={"q": HTML, "source": "de", "target": "en",
                                             "format": "html"})
    assert answer.status_code == 200, answer.text
    translated = answer.json()["translatedText"]
    assert structure(translated) == structure(HTML)
    assert 'var x = "Ein Hund";' in translated and "<code>Ein Hund</code>" in translated
    title = native(translators, "de_en", ["Ein Hund"])[0]
    assert f"<title>{title}</title>" in translated


def test_a_long_text_is_cut_not_refused(client):
    text = " ".join(["Dreihundertzwölf."] * 120)                      # 2,159 characters
    answer = client.post("/translate", json={"q": text, "source": "de", "target": "en"})
    assert answer.status_code == 200 and len(answer.json()["translatedText"].split()) >= 120
    too_long = client.post("/translate", json={"q": "sieben " * 20, "source": "de", "target": "en"})
    assert too_long.status_code == 400
    assert too_long.json() == {"error": "sentence 1 has 139 characters > max_chars 100"}


@pytest.mark.parametrize("body", [
    {"source": "de", "target": "en"}, {"q": "a", "source": "de"}, {"q": 5, "source": "de", "target": "en"},
    {"q": ["a", 5], "source": "de", "target": "en"}, {"q": "a", "source": 5, "target": "en"},
    {"q": "a", "source": "de", "target": "xx"}, {"q": "a", "source": "zz", "target": "en"},
    {"q": "a", "source": "de", "target": "en", "format": "pdf"},
    {"q": "a", "source": "de", "target": "en", "alternatives": -1},
    {"q": "a", "source": "de", "target": "en", "alternatives": "many"},
    {"q": "a", "source": "de", "target": "en", "alternatives": 10},
    {"q": ["a"] * 40, "source": "de", "target": "en"},
    {"q": "a", "source": "auto", "target": "cs"},
])
def test_every_bad_value_is_a_4xx_in_libretranslate_shape(client, body):
    answer = client.post("/translate", json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert list(answer.json()) == ["error"] and answer.json()["error"]


@pytest.mark.parametrize("raw,content_type", [
    (b"q=%FF%FE&source=de&target=en", "application/x-www-form-urlencoded"),
    (b"\xff\xfe", "application/x-www-form-urlencoded"),
    (b'["q"]', "application/json"),
    (b'{"q": "a\\ud800", "source": "de", "target": "en"}', "application/json"),
])
def test_unreadable_bodies_are_400(client, raw, content_type):
    answer = client.post("/translate", content=raw, headers={"Content-Type": content_type})
    assert answer.status_code in (400, 422) and "error" in answer.json()
    assert client.post("/detect", content=raw, headers={"Content-Type": content_type}).status_code == 400


def test_keys_are_required_and_rated(tiny_runs, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# key, requests per minute\nalice 2\nbob\n")
    app = create_app(Translator.from_run(tiny_runs["transformer"]), api_keys=ApiKeys.from_file(keys))
    request = {"q": "sieben", "source": "de", "target": "en"}
    with TestClient(app) as client:
        assert client.post("/translate", json=request).status_code == 403
        assert client.post("/translate", json={**request, "api_key": "eve"}).json() == \
            {"error": "Invalid API key"}
        assert client.post("/translate", json={"text": "sieben"}).status_code == 403
        assert client.post("/detect", data={"q": "sieben"}).status_code == 403
        assert client.post("/translate", json={**request, "api_key": "alice"}).status_code == 200
        assert client.post("/translate", json={"text": "sieben", "api_key": "alice"}).status_code == 200
        limited = client.post("/translate", params={**request, "api_key": "alice"})
        assert limited.status_code == 429 and 1 <= int(limited.headers["Retry-After"]) <= 60
        for _ in range(5):
            assert client.post("/translate", json={**request, "api_key": "bob"}).status_code == 200
        assert client.get("/languages").status_code == 200           # open, as LibreTranslate's
        assert client.get("/info").json()["api_keys"] is True


def test_each_client_address_has_its_rate(tiny_runs):
    app = create_app(Translator.from_run(tiny_runs["transformer"]), client_rate=3)
    with TestClient(app) as client:
        answers = [client.post("/translate", json={"text": "sieben"}),
                   client.post("/translate", json={"q": "sieben", "source": "de", "target": "en"}),
                   client.post("/detect", data={"q": "sieben"})]
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        refused = client.post("/translate", json={"text": "sieben"})
        assert refused.status_code == 429 and refused.json()["error"].startswith(
            "Slowdown: a client may make 3 requests per minute; retry in ")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert client.get("/health").status_code == 200          # only translation is rated


def test_a_rate_window_keeps_the_most_recent_clients_only():
    from attnmt.libretranslate import RateWindow

    window = RateWindow(most_keys=2)
    for number, address in enumerate(["a", "b", "a", "c"]):
        window.admit(address, 5, "a client", now=float(number))
    assert list(window.recent) == ["a", "c"]                     # b was the least recently seen
    assert [len(times) for times in window.recent.values()] == [2, 1]
    window = RateWindow(most_keys=100)
    for number in range(5000):                                   # forged addresses, one each
        window.admit(f"10.0.{number // 256}.{number % 256}", 1, "a client", now=0.0)
    assert len(window.recent) == 100
    with pytest.raises(ApiError):
        window.admit("10.0.19.135", 1, "a client", now=1.0)


def test_a_key_frees_its_rate_after_a_minute():
    keys = ApiKeys({"alice": 1})
    keys.admit("alice", now=100.0)
    with pytest.raises(ApiError) as refused:
        keys.admit("alice", now=130.0)
    assert (refused.value.status, refused.value.retry_after) == (429, 30)
    keys.admit("alice", now=160.5)


@pytest.mark.parametrize("content,message", [
    ("alice 2 3\n", "line 1: expected 'KEY' or 'KEY REQUESTS_PER_MINUTE', got 'alice 2 3'"),
    ("\nbob fast\n", "line 2: expected"),
    ("# nobody\n", "the file lists no key"),
])
def test_a_bad_key_file_is_named(tmp_path, content, message):
    path = tmp_path / "keys.txt"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        ApiKeys.from_file(path)
    with pytest.raises(UserError, match="cannot read it"):
        ApiKeys.from_file(tmp_path / "missing.txt")


# --- LibreTranslate's clients, unchanged, against a real server ----------------------------

def clients_talk_to(python: str, runs: list) -> None:
    """libretranslatepy and deep-translator translate, list languages and detect through
    ``attnmt serve`` run by ``python``."""
    from deep_translator import LibreTranslator
    from libretranslatepy import LibreTranslateAPI

    port = free_port()
    server = start_server(python, runs, port)
    url = f"http://127.0.0.1:{port}/"
    try:
        api = LibreTranslateAPI(url)
        assert api.languages() == [{"code": "de", "name": "German", "targets": ["en"]},
                                   {"code": "fr", "name": "French", "targets": ["en"]}]
        translated = api.translate("Sieben. Acht.", "de", "en")
        assert isinstance(translated, str) and translated
        assert api.detect(GERMAN)[0]["language"] == "de"
        assert api.translate(FRENCH, "auto", "en")
        deep = LibreTranslator(source="de", target="en", custom_url=url, api_key="unused")
        assert deep.translate("Sieben. Acht.") == translated
        assert deep.translate_batch(["Sieben.", "Acht."]) == [
            api.translate("Sieben.", "de", "en"), api.translate("Acht.", "de", "en")]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_libretranslate_clients_talk_to_attnmt_serve(tiny_runs, french_run):
    clients_talk_to(sys.executable, [f"de_en={tiny_runs['transformer']}", f"fr_en={french_run}"])


def test_translate_split_sentences_keeps_each_paragraph_on_its_line(tiny_runs, tmp_path):
    import subprocess

    paragraphs = ["Sieben. Acht.", "", "  Neun.  Zehn!", "Elf"]
    source = tmp_path / "paragraphs.de"
    source.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    run = str(tiny_runs["transformer"])
    done = subprocess.run([sys.executable, "-m", "attnmt", "translate", run, "--split-sentences",
                           "-i", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    translator = Translator.from_run(run)
    expected = []
    for paragraph in paragraphs:
        sentences, gaps = split_sentences(paragraph, "de")
        expected.append(join_sentences([t.best.text for t in translator.translate(sentences)]
                                       if sentences else [], gaps))
    assert done.stdout.split("\n")[:-1] == expected
    assert expected[2].startswith("  ") and expected[1] == ""
    refused = subprocess.run([sys.executable, "-m", "attnmt", "translate", run, "--split-sentences",
                              "--n-best", "2", "-i", str(source)], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "--split-sentences writes one translated paragraph a line" in refused.stderr
