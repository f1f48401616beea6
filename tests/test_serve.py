import asyncio
import json
import re
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import httpx2
import pytest
from fastapi.testclient import TestClient

from attnmt.decoding import Sampling
from attnmt.serve import Limits, create_app
from attnmt.translator import Translator


@pytest.fixture(scope="module")
def client(tiny_runs):
    app = create_app(Translator.from_run(tiny_runs["transformer"]),
                     Limits(max_chars=50, max_texts=3, max_beam=4, max_n_best=3))
    with TestClient(app) as test_client:
        yield test_client


def test_health_and_info(client):
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info.pop("api_keys") is False                # open to every client
    assert info.pop("models") == [{**info}]               # one model, named "model"
    assert info == {"name": "model", "model": "Transformer, 1+1 layers, 2 heads", "engine": "torch", "src_lang": "de",
                    "tgt_lang": "en", "target_langs": ["en"], "parameters": info["parameters"], "has_attention": True,
                    "layers": 1, "heads": 2, "has_self_attention": True, "max_source_tokens": 39,
                    "default_beam": 5, "tokenizer": "sentencepiece",
                    "limits": {"max_chars": 50, "max_texts": 3, "max_beam": 4, "max_n_best": 3,
                               "max_work": 8000, "max_response_values": 500_000}}
    assert info["parameters"] > 0                       # no config, no server paths
    assert client.get("/docs").status_code == 404       # its page needs the internet
    assert client.get("/openapi.json").status_code == 200


def test_page_is_served_with_its_assets_inline(client):
    page = client.get("/")
    assert page.status_code == 200 and "attention viewer" in page.text
    assert "src=\"http" not in page.text and "href=\"http" not in page.text


def test_translate_one_and_many(client):
    one = client.post("/translate", json={"text": "sieben", "beam": 2, "n_best": 2}).json()
    (translation,) = one["translations"]
    assert translation["source"] == "sieben" and len(translation["hypotheses"]) == 2
    assert translation["translation"] == translation["hypotheses"][0]["text"]
    assert "attention" not in translation["hypotheses"][0]
    many = client.post("/translate", json={"texts": ["sieben", "", "acht"]}).json()
    assert [t["source"] for t in many["translations"]] == ["sieben", "", "acht"]
    assert many["translations"][1]["translation"] == ""


def test_whitespace_and_control_characters_never_reach_the_model(client):
    texts = ["   \n\t ", "\x00\x01", "\x00sieben\x1b", "sieben", "\u200bsieben\u00a0"]
    data = [translation for start in (0, 3)       # the client's limit: three texts a request
            for translation in client.post("/translate", json={"texts": texts[start:start + 3]})
            .json()["translations"]]
    assert [t["translation"] for t in data[:2]] == ["", ""]
    assert [t["source_tokens"] for t in data[:2]] == [[], []]
    assert data[2]["translation"] == data[3]["translation"] == data[4]["translation"] != ""
    assert data[2]["source_tokens"] == data[3]["source_tokens"] == data[4]["source_tokens"]


def test_target_lang_of_a_bilingual_model(client):
    same = client.post("/translate", json={"text": "sieben", "target_lang": "en"})
    assert same.status_code == 200
    other = client.post("/translate", json={"text": "sieben", "target_lang": "fr"})
    assert other.status_code == 422
    assert other.json()["error"] == ("target_lang: target language 'fr': this model translates de "
                                     "into en only")


def test_attention_per_layer_and_head(client):
    data = client.post("/translate", json={"text": "dreihundertzwölf", "beam": 2, "attention": True,
                                           "self_attention": True}).json()["translations"][0]
    hypothesis = data["hypotheses"][0]
    layers, heads = len(hypothesis["attention"]), len(hypothesis["attention"][0])
    assert (layers, heads) == (1, 2)
    rows = hypothesis["attention"][0][0]
    assert len(rows) == len(hypothesis["tokens"]) + 1
    assert all(len(row) == len(data["source_tokens"]) + 1 for row in rows)
    assert all(abs(sum(row) - 1) < 1e-2 for row in rows)
    encoder = data["encoder_self_attention"][0][0]
    assert len(encoder) == len(encoder[0]) == len(data["source_tokens"]) + 1


def test_sampling_request(client):
    body = {"text": "dreihundertzwölf", "n_best": 3, "sample": {"temperature": 1.5, "seed": 4}}
    first = client.post("/translate", json=body).json()["translations"][0]["hypotheses"]
    again = client.post("/translate", json=body).json()["translations"][0]["hypotheses"]
    assert len(first) == 3 and first == again
    scores = [h["score"] for h in first]
    assert scores == sorted(scores, reverse=True)
    bad = client.post("/translate", json={"text": "sieben", "sample": {"top_p": 0}})
    assert bad.status_code == 422 and "sample.top_p" in bad.json()["error"]


def test_rnn_attention_is_one_layer_one_head(tiny_runs):
    with TestClient(create_app(Translator.from_run(tiny_runs["rnn"]))) as client:
        data = client.post("/translate", json={"text": "sieben", "attention": True}).json()
        hypothesis = data["translations"][0]["hypotheses"][0]
        assert len(hypothesis["attention"]) == 1 and len(hypothesis["attention"][0]) == 1
        refused = client.post("/translate", json={"text": "sieben", "self_attention": True})
        assert refused.status_code == 422 and "has no self-attention" in refused.json()["error"]
        info = client.get("/info").json()
        assert (info["layers"], info["heads"], info["has_self_attention"]) == (1, 1, False)


@pytest.mark.parametrize("body,status,message", [
    ({"text": "x" * 51}, 413, "text 1 has 51 characters > max_chars 50"),
    ({"texts": ["a", "b", "c", "d"]}, 413, "too many texts: 4 > max_texts 3"),
    ({"text": "sieben", "beam": 5}, 422, "beam must be between 1 and max_beam 4, got 5"),
    ({"text": "sieben", "beam": 2, "n_best": 3}, 422, "n_best must be between 1 and"),
    ({"text": "a", "texts": ["b"]}, 422, "give exactly one of 'text' or 'texts'"),
    ({}, 422, "give exactly one of 'text' or 'texts'"),
    ({"text": 5}, 422, "invalid request: body.text"),
    ({"text": "a", "colour": "red"}, 422, "invalid request: body.colour"),
])
def test_limits_and_bad_requests(client, body, status, message):
    response = client.post("/translate", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


@pytest.mark.parametrize("raw,field", [
    (b'{"text": "sieben", "alpha": 1e308}', "body.alpha: Input should be less than or equal to 10"),
    (b'{"text": "sieben", "alpha": -50}', "body.alpha: Input should be greater than or equal to 0"),
    (b'{"text": "sieben", "alpha": NaN}', "body.alpha: Input should be a finite number"),
    (b'{"text": "sieben", "alpha": Infinity}', "body.alpha: Input should be a finite number"),
    (b'{"text": "sieben \\ud800"}', "body.text: Value error, must be valid Unicode"),
    (b'{"texts": ["a", "\\udfff"]}', "body.texts: Value error, must be valid Unicode"),
    (b'{"text": "sieben", "beam": 0}', "body.beam: Input should be greater than or equal to 1"),
    (b'{"text": "sieben", "sample": {"temperature": 0}}',
     "body.sample.temperature: Value error, must be at least 1e-37"),
    (b'{"text": "sieben", "sample": {"temperature": 1e-300}}',       # every score overflowed:
     "body.sample.temperature: Value error, must be at least 1e-37"),     # it answered garbage
])
def test_bad_values_are_422_naming_the_field_and_its_bounds(client, raw, field):
    response = client.post("/translate", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]
    assert client.get("/health").status_code == 200


def test_a_large_body_is_refused_before_it_is_read(tiny_runs):
    app = create_app(Translator.from_run(tiny_runs["transformer"]), Limits(max_body_bytes=1000))
    with TestClient(app) as client:
        big = b'{"text": "' + b"a" * 5000 + b'"}'
        response = client.post("/translate", content=big, headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        assert response.json() == {"error": "request body over max_body_bytes 1000"}

        def streamed():                           # no Content-Length: counted while it arrives
            for _ in range(10):
                yield b" " * 500
        chunked = client.post("/translate", content=streamed(), headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
        assert client.post("/translate", json={"text": "sieben"}).status_code == 200


def test_work_budget_and_queue_bound(tiny_runs):
    translator = Translator.from_run(tiny_runs["transformer"])
    source = len(translator.source_tokenizer.encode("dreihundertzwölf"))
    one = int(source * 1.5 + 10) * 5                  # the output length limit x beam 5
    limits = Limits(max_work=2 * one, max_queue_work=2 * one + one // 2)
    with TestClient(create_app(translator, limits)) as client:
        heavy = client.post("/translate", json={"texts": ["dreihundertzwölf"] * 3, "beam": 5})
        assert heavy.status_code == 413
        assert (f"needs up to {3 * one} token-beams of work (output length limit x beam) > "
                f"max_work {2 * one}" in heavy.json()["error"])
        assert client.post("/translate", json={"text": "dreihundertzwölf", "beam": 5}).status_code == 200
    gate = asyncio.Event()
    original = translator.translate

    def slow_translate(*args, **kwargs):           # holds the worker until the test lets go
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(timeout=30)
        return original(*args, **kwargs)

    app = create_app(translator, limits, micro_batch=False)

    async def run_all():
        nonlocal loop
        loop = asyncio.get_running_loop()
        translator.translate = slow_translate
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {"text": "dreihundertzwölf", "beam": 5}
            first = [asyncio.create_task(client.post("/translate", json=body)) for _ in range(2)]
            await asyncio.sleep(0.3)                      # 2 x one waiting: no room for a third
            third = await client.post("/translate", json=body)
            gate.set()
            return third, [await task for task in first]

    loop = None
    try:
        third, first = asyncio.run(run_all())
    finally:
        translator.translate = original
    assert third.status_code == 503 and third.headers["Retry-After"] == "1"
    assert "busy" in third.json()["error"]
    assert [response.status_code for response in first] == [200, 200]


def test_malformed_json_is_422_and_the_server_goes_on(client):
    response = client.post("/translate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert client.get("/health").status_code == 200


def test_over_long_input_in_tokens_is_a_clear_error(tiny_runs):
    app = create_app(Translator.from_run(tiny_runs["transformer"]), Limits(max_chars=100_000))
    with TestClient(app) as client:
        response = client.post("/translate", json={"text": "sieben " * 1100})
    assert response.status_code == 413 and "this model accepts at most" in response.json()["error"]


@pytest.mark.parametrize("workers", [1, 3])
def test_concurrent_requests_are_batched_and_answered_to_the_right_caller(tiny_runs, workers):
    """With several workers, several micro-batches are decoded at once; every caller still
    gets the answer to its own text."""
    translator = Translator.from_run(tiny_runs["transformer"])
    batch_sizes = []
    original = translator.translate

    def recording_translate(texts, *args, **kwargs):
        batch_sizes.append(len(texts))
        return original(texts, *args, **kwargs)

    translator.translate = recording_translate
    app = create_app(translator, wait_ms=50, workers=workers)
    words = ["sieben", "acht", "neun", "zehn", "elf", "zwölf", "dreizehn", "vierzehn"]

    async def run_all():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            alone = {w: (await client.post("/translate", json={"text": w, "beam": 2})).json()
                     for w in words}
            together = await asyncio.gather(*(client.post("/translate", json={"text": w, "beam": 2})
                                              for w in words))
            return alone, [r.json() for r in together]

    alone, together = asyncio.run(run_all())
    assert batch_sizes[:len(words)] == [1] * len(words)           # one after another: alone
    assert max(batch_sizes[len(words):]) > 1                      # at once: batched together
    for word, response in zip(words, together):
        assert response["translations"][0]["source"] == word
        assert response == alone[word]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(python: str, runs, port: int, *options: str) -> subprocess.Popen:
    """``attnmt serve RUN [RUN ...] [OPTION ...]`` in a process of its own, once it answers
    /health."""
    runs = [str(run) for run in (runs if isinstance(runs, list) else [runs])]
    server = subprocess.Popen([python, "-m", "attnmt", "serve", *runs, "--port", str(port),
                               "--threads", "1", *options], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return server
        except OSError:
            assert time.time() < deadline and server.poll() is None, server.stderr.read()
            time.sleep(0.2)


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def browser(tmp_path, language: str = "en"):
    """Headless Chromium driven by Selenium, asking for pages in ``language``."""
    if not (CHROMIUM and CHROMEDRIVER):
        message = "browser test needs Debian's chromium and chromium-driver (apt-get install ...)"
        if os.environ.get("CI"):                 # CI installs them: missing there is a failure
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={tmp_path / f'profile-{language}'}",
                 "--window-size=1400,1000", f"--lang={language}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"intl.accept_languages": language})
    return webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)


def test_page_in_a_real_browser(tiny_runs, one_to_many_run, char_run, tmp_path):
    """Two models side by side with their attention, the beam tree with the chosen path, an
    edited prefix decoded again, a one-to-many model's target language, a clicked token of a
    character-level model as text, a slow earlier answer that no longer draws over a newer
    one, and the labels in Korean for a Korean browser."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    port = free_port()
    server = start_server(sys.executable, [f"transformer={tiny_runs['transformer']}",
                                           f"bahdanau={tiny_runs['rnn']}", f"multi={one_to_many_run}",
                                           f"chars={char_run}"],
                          port)
    driver = None
    try:
        driver = browser(tmp_path)
        driver.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: "parameters" in d.find_element(By.ID, "info").text)
        driver.find_element(By.ID, "source").send_keys("sieben")     # both tiny models answer it
        Select(driver.find_element(By.ID, "compare")).select_by_value("bahdanau")
        driver.find_element(By.ID, "trace").click()
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: all(t.text.strip() for t in d.find_elements(By.CSS_SELECTOR, ".translation"))
                   and len(d.find_elements(By.CSS_SELECTOR, ".translation")) == 2)
        panels = driver.find_elements(By.CSS_SELECTOR, ".panel")
        assert [p.get_attribute("data-model") for p in panels] == ["transformer", "bahdanau"]
        for panel in panels:                                  # each model its own attention
            sources = panel.find_elements(By.CSS_SELECTOR, ".src-token")
            targets = panel.find_elements(By.CSS_SELECTOR, ".tgt-token")
            assert sources and targets and panel.find_elements(By.CSS_SELECTOR, ".cross table")
            ActionChains(driver).move_to_element(targets[0]).perform()
            wait.until(lambda d: any(float(s.get_attribute("data-weight") or 0) > 0 for s in sources))
            weights = [float(s.get_attribute("data-weight")) for s in sources]
            assert abs(sum(weights) - 1) < 0.05               # one output token's attention
        tree = panels[0].find_element(By.CSS_SELECTOR, ".tree svg")
        chosen = tree.find_elements(By.CSS_SELECTOR, ".node.chosen")
        output = [t.text for t in panels[0].find_elements(By.CSS_SELECTOR, ".tgt-token")][:-1]
        assert len(chosen) == len(output) + 1                 # every chosen token, and </s>
        assert chosen[-1].get_attribute("data-tokens").split() == output + ["</s>"]
        assert tree.find_elements(By.CSS_SELECTOR, ".edge.chosen")
        assert driver.save_screenshot(str(tmp_path / "page.png"))
        first_word = panels[0].find_elements(By.CSS_SELECTOR, ".tgt-token")[0]
        first_word.click()                                    # keep the output up to it ...
        prefix = driver.find_element(By.ID, "prefix")
        assert prefix.get_attribute("value") == output[0].replace("\u2581", "")
        prefix.clear()
        prefix.send_keys("seven hundred")                     # ... edit it, decode again
        driver.find_element(By.ID, "continue").click()
        wait.until(lambda d: all(t.text.startswith("seven hundred")
                                 for t in d.find_elements(By.CSS_SELECTOR, ".translation")))
        language = driver.find_element(By.ID, "target-lang")
        assert not language.is_displayed()                   # one target language: no choice
        Select(driver.find_element(By.ID, "compare")).select_by_value("")
        Select(driver.find_element(By.ID, "model")).select_by_value("multi")
        Select(language).select_by_value("fr")
        driver.find_element(By.ID, "translate").click()
        expected = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/translate", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"text": "sieben", "model": "multi", "target_lang": "fr", "beam": 5,
                             "n_best": 3}).encode()), timeout=30).read())["translations"][0]["translation"]
        wait.until(lambda d: [t.text for t in d.find_elements(By.CSS_SELECTOR, ".translation")] == [expected])
        Select(driver.find_element(By.ID, "model")).select_by_value("chars")
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".tgt-token")) > 3)
        text = driver.find_element(By.CSS_SELECTOR, ".translation").get_attribute("textContent")
        driver.find_elements(By.CSS_SELECTOR, ".tgt-token")[2].click()     # "h e l" was put there
        assert prefix.get_attribute("value") == text[:3]
        driver.execute_script("""                    // the next answer arrives 3 s late
            const realFetch = window.fetch; let delayed = false;
            window.fetch = (...args) => (args[0] === "/translate" && !delayed) ?
              (delayed = true, new Promise((done) => setTimeout(() => done(realFetch(...args)), 3000)))
              : realFetch(...args);""")
        Select(driver.find_element(By.ID, "model")).select_by_value("transformer")
        source = driver.find_element(By.ID, "source")
        source.clear()
        source.send_keys("acht")
        driver.find_element(By.ID, "translate").click()                   # slow
        source.clear()
        source.send_keys("sieben")
        driver.find_element(By.ID, "translate").click()                   # fast, and the newer
        newer = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/translate", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"text": "sieben", "model": "transformer", "beam": 5, "n_best": 3,
                             "attention": True}).encode()), timeout=30).read())["translations"][0]
        wait.until(lambda d: [t.text for t in d.find_elements(By.CSS_SELECTOR, ".translation")]
                   == [newer["translation"]])
        time.sleep(3.5)                                 # the slow answer has come, and is not drawn
        assert [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".translation")] == \
            [newer["translation"]]
        assert [s.text for s in driver.find_elements(By.CSS_SELECTOR, ".src-token")][:-1] == \
            newer["source_tokens"]
        driver.quit()
        driver = browser(tmp_path, "ko")
        driver.get(f"http://127.0.0.1:{port}/")
        assert driver.find_element(By.ID, "translate").text == "번역"
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def two_models(tiny_runs):
    app = create_app({"transformer": Translator.from_run(tiny_runs["transformer"]),
                      "bahdanau": Translator.from_run(tiny_runs["rnn"])}, Limits(max_texts=4))
    with TestClient(app) as test_client:
        yield test_client


def test_several_models_are_listed_and_chosen_by_name(two_models):
    info = two_models.get("/info").json()
    assert [model["name"] for model in info["models"]] == ["transformer", "bahdanau"]
    assert info["name"] == "transformer"                      # the first is the default
    assert [model["heads"] for model in info["models"]] == [2, 1]
    answers = {name: two_models.post("/translate", json={"text": "dreihundertzwölf", "model": name,
                                                         "attention": True}).json()
               for name in ("transformer", "bahdanau")}
    assert answers["transformer"]["model"] == "transformer" and answers["bahdanau"]["model"] == "bahdanau"
    grids = {name: answer["translations"][0]["hypotheses"][0]["attention"] for name, answer in answers.items()}
    assert (len(grids["transformer"]), len(grids["transformer"][0])) == (1, 2)
    assert (len(grids["bahdanau"]), len(grids["bahdanau"][0])) == (1, 1)
    default = two_models.post("/translate", json={"text": "dreihundertzwölf"}).json()
    assert default["model"] == "transformer"
    unknown = two_models.post("/translate", json={"text": "sieben", "model": "luong"})
    assert unknown.status_code == 422
    assert unknown.json()["error"] == "model: unknown model 'luong'; this server has transformer, bahdanau"


def test_prefix_is_honoured_and_a_bad_one_named(client, tiny_runs):
    translator = Translator.from_run(tiny_runs["transformer"])
    prefix_pieces = translator.target_tokenizer.pieces("three hundred")
    for beam in (1, 3):
        data = client.post("/translate", json={"texts": ["sieben", "dreihundertzwölf"], "beam": beam,
                                               "prefix": "three hundred"}).json()["translations"]
        for translation in data:
            assert translation["hypotheses"][0]["tokens"][:len(prefix_pieces)] == prefix_pieces
            assert translation["translation"].startswith("three hundred")
    for prefix, message in (("ß€", r"^prefix: prefix 1: 'ß€' cannot be written"),
                            ("three " * 30, r"^prefix: prefix 1 has 30 tokens; the translation of "
                                            r"text 1 may have at most \d+$")):
        refused = client.post("/translate", json={"text": "sieben", "prefix": prefix})
        assert refused.status_code == 422 and re.match(message, refused.json()["error"])


def test_beam_steps_agree_with_the_n_best(client):
    data = client.post("/translate", json={"text": "dreihundertzwölf", "beam": 4, "n_best": 3,
                                           "trace": True}).json()["translations"][0]
    steps = data["search_steps"]
    assert [step["step"] for step in steps] == list(range(len(steps)))
    finished = sorted((item for step in steps for item in step["finished"]), key=lambda h: -h["score"])
    assert [(h["tokens"], h["score"]) for h in finished[:3]] == \
        [(h["tokens"], h["score"]) for h in data["hypotheses"]]
    for step in steps:
        assert len(step["kept"]) <= 4 and all(len(h["tokens"]) == step["step"] + 1 for h in step["kept"])
    for earlier, later in zip(steps, steps[1:]):          # every kept hypothesis extends a kept one
        parents = {tuple(h["tokens"]) for h in earlier["kept"]}
        assert all(tuple(h["tokens"][:-1]) in parents for h in later["kept"] + later["pruned"])
    sampled = client.post("/translate", json={"text": "sieben", "trace": True, "sample": {}})
    assert sampled.status_code == 422 and sampled.json()["error"].startswith("trace: ")


def response_values(node) -> int:
    """The numbers and strings a JSON response carries (keys and nesting not counted)."""
    if isinstance(node, dict):
        return sum(response_values(value) for value in node.values())
    if isinstance(node, list):
        return sum(response_values(value) for value in node)
    return 1


def test_the_killer_request_is_refused_before_decoding(one_to_many_run, monkeypatch):
    # 390 characters, beam 10, n-best 10, alpha 10, attention and self-attention: the server
    # grew to 24 GB and was killed. The response is bounded before any decoding.
    translator = Translator.from_run(one_to_many_run)
    monkeypatch.setattr(translator, "translate", lambda *a, **k: pytest.fail("decoded"))
    body = {"text": "x. " * 130, "beam": 10, "n_best": 10, "alpha": 10, "attention": True,
            "self_attention": True}
    with TestClient(create_app(translator)) as client:
        refused = client.post("/translate", json=body)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert re.match(r"the response could carry \d+ values \(hypotheses \d+, attention \d+, "
                        r"self_attention \d+\) > max_response_values 500000; leave out attention",
                        error), error
        traced = client.post("/translate", json={**body, "attention": False,
                                                 "self_attention": False, "trace": True})
        assert traced.status_code == 413 and "leave out trace" in traced.json()["error"]
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("extra", [
    {"beam": 4, "n_best": 4, "alpha": 10, "attention": True, "self_attention": True},
    {"beam": 4, "n_best": 2, "alpha": 10, "trace": True},
    {"n_best": 3, "attention": True, "sample": {"temperature": 5.0}},
    {"beam": 3, "n_best": 3, "prefix": "seven"},
])
def test_what_a_response_carries_stays_within_its_cost(tiny_runs, extra):
    # The cost is counted before decoding from the output length limit; the response,
    # whatever the search does, never carries more values than that.
    from attnmt.serve import Options, request_cost

    translator = Translator.from_run(tiny_runs["transformer"])
    texts = ["dreihundertzwölf", "", "sieben sieben sieben sieben sieben"]
    with TestClient(create_app(translator, Limits(max_response_values=60_000))) as client:
        answer = client.post("/translate", json={"texts": texts, **extra})
    assert answer.status_code == 200, answer.text
    sampling = extra.get("sample")
    options = Options(extra.get("beam", 5), extra["n_best"], extra.get("alpha"),
                      extra.get("attention", False), sampling and Sampling(**sampling),
                      None, extra.get("prefix"), extra.get("trace", False),
                      extra.get("self_attention", False))
    cost = request_cost(translator, texts, options)
    carried = response_values(answer.json()["translations"])
    assert carried <= cost.values, (carried, cost)
    assert cost.values < 60_000


def test_a_source_that_fills_the_positions_is_translated_not_refused_after_decoding(tiny_runs):
    # max_positions 40: 39 source tokens allow 1.5 x 39 + 10 = 68 output tokens, more than
    # the decoder has positions; the output is capped at 40 instead of failing (422).
    translator = Translator.from_run(tiny_runs["transformer"])
    text = "sieben"
    while len(translator.source_tokenizer.encode(text + " sieben")) <= 39:
        text += " sieben"
    with TestClient(create_app(translator, Limits(max_chars=1000))) as client:
        for body in ({"beam": 4, "alpha": 10, "n_best": 2}, {"beam": 1}):
            answer = client.post("/translate", json={"text": text, **body})
            assert answer.status_code == 200, answer.text
            hypotheses = answer.json()["translations"][0]["hypotheses"]
            assert all(len(h["tokens"]) < 40 for h in hypotheses)


def test_the_length_check_counts_the_target_language_tag(one_to_many_run, monkeypatch):
    translator = Translator.from_run(one_to_many_run)
    text = "sieben acht neun"
    monkeypatch.setattr(translator.engine, "max_source_tokens",
                        len(translator.source_tokenizer.encode(text)))     # the tag is one more
    with TestClient(create_app(translator)) as client:
        refused = client.post("/translate", json={"text": text, "target_lang": "fr"})
    assert refused.status_code == 413
    assert refused.json()["error"].startswith("text 1 has ")


def test_a_tag_typed_in_a_request_is_translated_as_text(one_to_many_run):
    with TestClient(create_app(Translator.from_run(one_to_many_run))) as client:
        typed = client.post("/translate", json={"text": "<2fr> sieben", "target_lang": "en",
                                                "attention": True}).json()["translations"][0]
    assert typed["source_tokens"][0] == "<2en>" and "<2fr>" not in typed["source_tokens"]
    attention = typed["hypotheses"][0]["attention"]
    assert len(attention[0][0][0]) == len(typed["source_tokens"]) + 1       # and the EOS


def test_a_failing_request_fails_alone(tiny_runs):
    # Two requests in one micro-batch; decoding one of them fails. The other is answered,
    # and the error numbers the failing request's own texts and names nobody else's.
    from attnmt.errors import UserError

    translator = Translator.from_run(tiny_runs["transformer"])
    original, batches = translator.translate, []

    def failing_translate(texts, *args, **kwargs):
        batches.append(list(texts))
        if "neun" in texts:
            raise UserError(f"input {texts.index('neun') + 1} cannot be decoded")
        return original(texts, *args, **kwargs)

    translator.translate = failing_translate
    app = create_app(translator, wait_ms=200)

    async def run_both():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(
                client.post("/translate", json={"texts": ["sieben", "acht"], "beam": 2}),
                client.post("/translate", json={"texts": ["neun"], "beam": 2}))

    normal, failing = asyncio.run(run_both())
    assert batches[0] == ["sieben", "acht", "neun"]                    # they did share a batch
    assert normal.status_code == 200
    assert [t["source"] for t in normal.json()["translations"]] == ["sieben", "acht"]
    assert failing.status_code == 422
    assert failing.json() == {"error": "input 1 cannot be decoded"}


def test_health_answers_while_a_response_is_rendered(tiny_runs, monkeypatch):
    import attnmt.serve

    original = attnmt.serve.describe

    def slow_describe(*args, **kwargs):
        time.sleep(1.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(attnmt.serve, "describe", slow_describe)
    app = create_app(Translator.from_run(tiny_runs["transformer"]))

    async def run_both():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            translation = asyncio.create_task(client.post("/translate", json={"text": "sieben"}))
            await asyncio.sleep(0.5)
            start = time.perf_counter()
            health = await client.get("/health")
            waited = time.perf_counter() - start
            return health, waited, translation.done(), await translation

    health, waited, finished_first, translation = asyncio.run(run_both())
    assert health.status_code == 200 and waited < 0.5 and not finished_first
    assert translation.status_code == 200
