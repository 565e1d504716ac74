"""`generated_translation`: a deterministic English->German toy corpus.

A small grammar with real German phenomena, so that a model has to learn
them rather than copy words:
- gender (der/die/das) and case agreement (nominative, accusative, dative)
  of articles and adjectives, with weak/mixed/strong adjective endings;
- weak masculine nouns (den Jungen), dative plural -n (mit den Kindern);
- plurals and numbers ("three big dogs" -> "drei große Hunde");
- verb-second order (fronted adverbs, fronted subordinate clauses invert
  subject and verb), verb brackets (perfect, modals), verb-final
  subordinate clauses (", weil ...", ", dass ..."), yes/no questions;
- prepositions that govern case (mit + dative, für + accusative, im = in dem).

Subject and object are made of the same words, so the bag of words does not
determine the translation: a model without positional information fails.

Pure Python; the same seed gives the same bytes on every machine.
"""

from __future__ import annotations

import random

from transformer_jax.errors import UserError

# --- Lexicon ---------------------------------------------------------------
# Nouns: en_sg en_pl de_sg de_pl gender tags ('w' in gender = weak masculine,
# whose oblique singular equals its plural). Tags: h human, a animal, t
# thing, r readable, e edible, o openable, p place (in), s spot (an).
_NOUNS = """
man men Mann Männer m h|woman women Frau Frauen f h|child children Kind Kinder n h
girl girls Mädchen Mädchen n h|boy boys Junge Jungen mw h|teacher teachers Lehrer Lehrer m h
student students Student Studenten mw h|doctor doctors Arzt Ärzte m h
farmer farmers Bauer Bauern mw h|neighbor neighbors Nachbar Nachbarn mw h
king kings König Könige m h|queen queens Königin Königinnen f h|cook cooks Koch Köche m h
baker bakers Bäcker Bäcker m h|sister sisters Schwester Schwestern f h
brother brothers Bruder Brüder m h|mother mothers Mutter Mütter f h
father fathers Vater Väter m h|friend friends Freund Freunde m h
dog dogs Hund Hunde m a|cat cats Katze Katzen f a|horse horses Pferd Pferde n a
bird birds Vogel Vögel m a|mouse mice Maus Mäuse f a|cow cows Kuh Kühe f a
bear bears Bär Bären mw a|elephant elephants Elefant Elefanten mw a
lion lions Löwe Löwen mw a|rabbit rabbits Kaninchen Kaninchen n a|duck ducks Ente Enten f a
wolf wolves Wolf Wölfe m a|fox foxes Fuchs Füchse m a|pig pigs Schwein Schweine n a
goat goats Ziege Ziegen f a|monkey monkeys Affe Affen mw a|frog frogs Frosch Frösche m a
book books Buch Bücher n tro|apple apples Apfel Äpfel m te|car cars Auto Autos n t
ball balls Ball Bälle m t|letter letters Brief Briefe m tro|table tables Tisch Tische m ts
chair chairs Stuhl Stühle m t|flower flowers Blume Blumen f t|bottle bottles Flasche Flaschen f to
cup cups Tasse Tassen f t|door doors Tür Türen f tos|window windows Fenster Fenster n tos
bicycle bicycles Fahrrad Fahrräder n t|hat hats Hut Hüte m t|key keys Schlüssel Schlüssel m t
picture pictures Bild Bilder n t|bag bags Tasche Taschen f to|cake cakes Kuchen Kuchen m te
egg eggs Ei Eier n te|shoe shoes Schuh Schuhe m t|newspaper newspapers Zeitung Zeitungen f tr
box boxes Kiste Kisten f to|bone bones Knochen Knochen m t|banana bananas Banane Bananen f te
pear pears Birne Birnen f te|boat boats Boot Boote n t|stone stones Stein Steine m t
umbrella umbrellas Schirm Schirme m t|garden gardens Garten Gärten m p|park parks Park Parks m p
house houses Haus Häuser n tp|kitchen kitchens Küche Küchen f p|city cities Stadt Städte f p
forest forests Wald Wälder m p|school schools Schule Schulen f p|room rooms Zimmer Zimmer n p
lake lakes See Seen m ps|river rivers Fluss Flüsse m ps|station stations Bahnhof Bahnhöfe m s
"""
_ADJECTIVES = """big groß|small klein|old alt|young jung|red rot|blue blau|green grün|fast schnell
tired müde|hungry hungrig|clever klug|new neu|beautiful schön|brown braun|black schwarz
white weiß|loud laut|quiet leise|happy glücklich|friendly freundlich"""
# Verbs: frame objects en_3sg en_base en_participle de_inf de_3sg
# de_participle aux. Frames: i intransitive, a accusative object, d dative
# object, g dative + accusative, c "that"-clause. objects: noun tags allowed.
_VERBS = """
a hatp sees see seen sehen sieht gesehen h|a hat finds find found finden findet gefunden h
a t buys buy bought kaufen kauft gekauft h|a hat carries carry carried tragen trägt getragen h
a hat likes like liked mögen mag gemocht h|a ha hears hear heard hören hört gehört h
a hat catches catch caught fangen fängt gefangen h|a hat washes wash washed waschen wäscht gewaschen h
a h visits visit visited besuchen besucht besucht h|a hatp paints paint painted malen malt gemalt h
a hat needs need needed brauchen braucht gebraucht h|a r reads read read lesen liest gelesen h
a e eats eat eaten essen isst gegessen h|a t loses lose lost verlieren verliert verloren h
a t takes take taken nehmen nimmt genommen h|a o opens open opened öffnen öffnet geöffnet h
a hat holds hold held halten hält gehalten h|d ha helps help helped helfen hilft geholfen h
d h thanks thank thanked danken dankt gedankt h|d ha follows follow followed folgen folgt gefolgt s
d h answers answer answered antworten antwortet geantwortet h
g t gives give given geben gibt gegeben h|g t shows show shown zeigen zeigt gezeigt h
g t brings bring brought bringen bringt gebracht h|g t sends send sent schicken schickt geschickt h
i - sleeps sleep slept schlafen schläft geschlafen h|i - runs run run laufen läuft gelaufen s
i - plays play played spielen spielt gespielt h|i - sings sing sung singen singt gesungen h
i - swims swim swum schwimmen schwimmt geschwommen s|i - laughs laugh laughed lachen lacht gelacht h
i - waits wait waited warten wartet gewartet h|i - comes come come kommen kommt gekommen s
i - dances dance danced tanzen tanzt getanzt h|i - works work worked arbeiten arbeitet gearbeitet h
i - cries cry cried weinen weint geweint h|i - jumps jump jumped springen springt gesprungen s
c - says say said sagen sagt gesagt h|c - thinks think thought denken denkt gedacht h
c - knows know known wissen weiß gewusst h|c - believes believe believed glauben glaubt geglaubt h
"""
_FIRST_PERSON_SG = {"mögen": "mag", "wissen": "weiß"}
# Modals and the future: (en 3sg, en base, de 1sg, de 3sg, de plural).
_MODALS = (("can", "can", "kann", "kann", "können"),
           ("wants to", "want to", "will", "will", "wollen"),
           ("must", "must", "muss", "muss", "müssen"),
           ("will", "will", "werde", "wird", "werden"))
_AUX = {"h": ("habe", "hat", "haben"), "s": ("bin", "ist", "sind")}
# Time adverbs: en, de, may be fronted in English.
_ADVERBS = (("today", "heute", True), ("now", "jetzt", True),
            ("often", "oft", True), ("sometimes", "manchmal", True),
            ("soon", "bald", False), ("tonight", "heute Abend", True))
# Prepositions: en, de, case, complement tags.
_PREPOSITIONS = (("in", "in", "dat", "p"), ("at", "an", "dat", "s"),
                 ("with", "mit", "dat", "hat"), ("for", "für", "acc", "ha"),
                 ("without", "ohne", "acc", "hat"), ("behind", "hinter", "dat", "hatp"),
                 ("under", "unter", "dat", "t"), ("next to", "neben", "dat", "hatps"))
_CONTRACTIONS = {("in", "dem"): "im", ("an", "dem"): "am"}
_NUMBERS = ("two zwei|three drei|four vier|five fünf|six sechs|seven sieben|eight acht"
            "|nine neun|ten zehn|eleven elf|twelve zwölf")
# Subordinating conjunctions: en, de, may be fronted.
_CONJUNCTIONS = (("because", "weil", True), ("although", "obwohl", True),
                 ("when", "wenn", True))

_CASES = {"nom": 0, "acc": 1, "dat": 2}
_MAX_WORDS = 20  # Longer draws are rejected: keeps sentences short-ish.
_GENDERS = {"m": 0, "f": 1, "n": 2, "pl": 3}
# [case][gender] tables.
_DEF = (("der", "die", "das", "die"), ("den", "die", "das", "die"),
        ("dem", "der", "dem", "den"))
_DIES = (("dieser", "diese", "dieses", "diese"), ("diesen", "diese", "dieses", "diese"),
         ("diesem", "dieser", "diesem", "diesen"))
_EIN_END = (("", "e", "", "e"), ("en", "e", "", "e"), ("em", "er", "em", "en"))
_WEAK = (("e", "e", "e", "en"), ("en", "e", "e", "en"), ("en", "en", "en", "en"))
_MIXED = (("er", "e", "es", "en"), ("en", "e", "es", "en"), ("en", "en", "en", "en"))
_STRONG_PL = ("e", "e", "en")

# Determiners: en_sg, en_pl (None: no form), German kind, German stem.
_DETERMINERS = (("the", "the", "def", ""), ("a", None, "ein", "ein"),
                ("my", "my", "ein", "mein"), ("no", "no", "ein", "kein"),
                ("this", "these", "dies", ""), (None, "many", "strong", "viel"),
                (None, "some", "strong", "einig"))


def _parse_nouns():
  nouns = []
  for entry in _NOUNS.replace("\n", "|").split("|"):
    if entry.strip():
      en_sg, en_pl, de_sg, de_pl, gender, tags = entry.split()
      nouns.append((en_sg, en_pl, de_sg, de_pl, gender[0], "w" in gender, tags))
  return nouns


def _parse_verbs():
  verbs = []
  for entry in _VERBS.replace("\n", "|").split("|"):
    if entry.strip():
      frame, objects, en3, en_base, en_part, inf, de3, de_part, aux = entry.split()
      de1 = _FIRST_PERSON_SG.get(inf, inf[:-2] + "e" if inf.endswith("en") else inf)
      verbs.append((frame, objects, en3, en_base, en_part, inf, de1, de3, de_part, aux))
  return verbs


_DETERMINERS_SG = [d for d in _DETERMINERS if d[0] is not None]
_DETERMINERS_PL = [d for d in _DETERMINERS if d[1] is not None]
_NOUN_LIST = _parse_nouns()
_BASE_OF = {v[2]: v[3] for v in _parse_verbs()}  # English 3sg -> base form.
_ADJ_LIST = [tuple(x.split()) for x in _ADJECTIVES.replace("\n", "|").split("|")]
_VERB_LIST = _parse_verbs()
_NUMBER_LIST = [tuple(x.split()) for x in _NUMBERS.split("|")]
_NOUNS_BY_TAG = {t: [n for n in _NOUN_LIST if t in n[6]] for t in "hatreops"}
_VERBS_BY_FRAME = {f: [v for v in _VERB_LIST if v[0] == f] for f in "iadgc"}


def _nouns_with(tags: str):
  out = []
  for t in tags:
    out.extend(n for n in _NOUNS_BY_TAG[t] if n not in out)
  return out


# Nouns allowed by each tag set that verbs and prepositions ask for.
_CANDIDATES = {tags: _nouns_with(tags) for tags in
               {v[1] for v in _VERB_LIST if v[1] != "-"} | {p[3] for p in _PREPOSITIONS}
               | {"h", "ha"}}


# --- Realisation -----------------------------------------------------------
# person_number of a subject is '1sg', '1pl', '3sg' or '3pl'.


def _pick(rng: random.Random, seq):
  # Faster than rng.choice (one C call) and equally deterministic.
  return seq[int(rng.random() * len(seq))]


def _adj_form(stem: str, ending: str) -> str:
  if stem.endswith("e") and ending.startswith("e"):
    ending = ending[1:]  # müde + e -> müde, leise + en -> leisen.
  return stem + ending


def _noun_phrase(rng: random.Random, tags: str, adj_prob: float, case: int):
  """Samples a noun phrase whose noun carries one of `tags`.

  Returns (english, german in `case` (0 nom, 1 acc, 2 dat), person_number).
  """
  en_sg, en_pl, de_sg, de_pl, gender, weak, _ = _pick(rng, _CANDIDATES[tags])
  plural = rng.random() < 0.3
  adj = _pick(rng, _ADJ_LIST) if rng.random() < adj_prob else None
  if plural and rng.random() < 0.35:
    en_num, de_num = _pick(rng, _NUMBER_LIST)
    det = (None, en_num, "strong", de_num)
  else:
    det = _pick(rng, _DETERMINERS_PL if plural else _DETERMINERS_SG)
  en_det = det[1] if plural else det[0]
  kind, stem = det[2], det[3]
  en_noun = en_pl if plural else en_sg
  if en_det == "a" and (adj[0] if adj else en_noun)[0] in "aeiou":
    en_det = "an"
  en = f"{en_det} {en_noun}" if adj is None else f"{en_det} {adj[0]} {en_noun}"
  g = 3 if plural else _GENDERS[gender]
  c = case
  if kind == "def":
    art, table = _DEF[c][g], _WEAK
  elif kind == "dies":
    art, table = _DIES[c][g], _WEAK
  elif kind == "ein":
    art, table = stem + _EIN_END[c][g], _MIXED
  elif kind == "strong" and stem in ("viel", "einig"):
    art, table = stem + _STRONG_PL[c], None
  else:
    art, table = stem, None  # A number.
  if plural:
    noun = de_pl + "n" if c == 2 and de_pl[-1] not in "ns" else de_pl
  else:
    noun = de_pl if weak and c > 0 else de_sg
  if adj is None:
    de = f"{art} {noun}"
  else:
    ending = _STRONG_PL[c] if table is None else table[c][g]
    de = f"{art} {_adj_form(adj[1], ending)} {noun}"
  return en, de, "3pl" if plural else "3sg"


def _subject(rng: random.Random, tags: str, adj_prob: float):
  if rng.random() < 0.12:
    return ("I", "ich", "1sg") if rng.random() < 0.5 else ("we", "wir", "1pl")
  return _noun_phrase(rng, tags, adj_prob, 0)


def _pp(rng: random.Random, prep, adj_prob: float) -> tuple[str, str]:
  en_p, de_p, case, tags = prep
  en_np, de, _ = _noun_phrase(rng, tags, adj_prob, _CASES[case])
  art, _, rest = de.partition(" ")
  if (de_p, art) in _CONTRACTIONS:
    return f"{en_p} {en_np}", f"{_CONTRACTIONS[de_p, art]} {rest}"
  return f"{en_p} {en_np}", f"{de_p} {de}"


def _clause(rng: random.Random, depth: int):
  """Samples one clause.

  Returns (en_parts, de) where en_parts = (subject, finite, rest) for English
  do-support and de = (subject, finite, middle, right_bracket) for German
  word order; `finite` of English is the verb group as a list of words.
  """
  adj_prob = 0.35 if depth == 0 else 0.15
  frame = _pick(rng, "iiaaaaaddgc" if depth == 0 else "iiaaad")
  verb = _pick(rng, _VERBS_BY_FRAME[frame])
  _, objects, en3, en_base, en_part, inf, de1, de3, de_part, aux = verb
  en_subj, de_subj, pn = _subject(rng, "h" if frame == "c" else "ha", adj_prob)
  idx = {"1sg": 0, "3sg": 1}.get(pn, 2)
  tense = rng.random()
  if tense < 0.5:
    en_verb = [en3 if pn == "3sg" else en_base]
    de_fin, de_right = (de1, de3, inf)[idx], ""
    en_aux = None
  elif tense < 0.7:
    has = "has" if pn == "3sg" else "have"
    en_verb, en_aux = [has, en_part], has
    de_fin, de_right = _AUX[aux][idx], de_part
  else:
    modal = _pick(rng, _MODALS)
    m = modal[0] if pn == "3sg" else modal[1]
    en_verb, en_aux = [m, en_base], m
    de_fin, de_right = modal[2 + idx], inf
  en_rest, de_mid = [], []
  if frame in "dg":
    en_np, de_np, _ = _noun_phrase(rng, objects if frame == "d" else "ha", adj_prob, 2)
    en_rest.append(en_np)
    de_mid.append(de_np)
  if frame in "ag":
    en_np, de_np, _ = _noun_phrase(rng, objects, adj_prob, 1)
    en_rest.append(en_np)
    de_mid.append(de_np)
  sub = None
  if frame == "c":
    sub = _clause(rng, depth + 1)
  elif rng.random() < (0.3 if frame == "i" else 0.15) and depth < 2:
    prep = _pick(rng, _PREPOSITIONS)
    en_pp, de_pp = _pp(rng, prep, adj_prob * 0.5)
    en_rest.append(en_pp)
    de_mid.append(de_pp)
  return (en_subj, en_verb, en_aux, en_rest, sub, pn), (de_subj, de_fin, de_mid, de_right)


def _de_order(de, kind: str, conj: str = "") -> list[str]:
  """German word order: 'v2', 'inverted' (after a fronted item), 'sub'."""
  subj, fin, mid, right = de
  tail = mid + ([right] if right else [])
  if kind == "v2":
    return [subj, fin] + tail
  if kind == "inverted":
    return [fin, subj] + tail
  return [conj, subj] + tail + [fin]


def _realise(rng: random.Random) -> tuple[str, str]:
  """One sentence pair."""
  en_c, de_c = _clause(rng, 0)
  en_subj, en_verb, en_aux, en_rest, sub, pn = en_c
  if sub is not None:  # "X says that Y" -> "X sagt, dass Y" (verb final).
    (s_subj, s_verb, _, s_rest, _, _), s_de = sub
    en_rest = en_rest + ["that", s_subj] + s_verb + s_rest
    en_main = [en_subj] + en_verb + en_rest
    de = _de_order(de_c, "v2") + [","] + _de_order(s_de, "sub", "dass")
    return _finish(en_main, "."), _finish(de, ".")
  adverb = _pick(rng, _ADVERBS) if rng.random() < 0.25 else None
  if adverb is not None:  # Time early in the German middle field.
    de_c = (de_c[0], de_c[1], [adverb[1]] + de_c[2], de_c[3])
  r = rng.random()
  if r < 0.1:  # Yes/no question: verb first.
    if en_aux is None:
      does = "does" if pn == "3sg" else "do"
      en = [does, en_subj, _BASE_OF.get(en_verb[0], en_verb[0])] + en_rest
    else:
      en = [en_verb[0], en_subj] + en_verb[1:] + en_rest
    if adverb is not None:
      en.append(adverb[0])
    return _finish(en, "?"), _finish(_de_order(de_c, "inverted"), "?")
  en_main = [en_subj] + en_verb + en_rest
  if r < 0.35:  # Main clause + subordinate clause (verb final).
    conj = _pick(rng, _CONJUNCTIONS)
    (s_subj, s_verb, _, s_rest, _, _), s_de = _clause(rng, 1)
    en_sub = [conj[0], s_subj] + s_verb + s_rest
    de_sub = _de_order(s_de, "sub", conj[1])
    if adverb is not None:
      en_main.append(adverb[0])
    if rng.random() < 0.5:  # Fronted: "When Y, X." -> "Wenn Y, V X."
      en = en_sub + [","] + en_main
      de = de_sub + [","] + _de_order(de_c, "inverted")
    else:
      en = en_main + en_sub
      de = _de_order(de_c, "v2") + [","] + de_sub
    return _finish(en, "."), _finish(de, ".")
  if adverb is not None and adverb[2] and rng.random() < 0.5:
    # "Today the dog sleeps." -> "Heute schläft der Hund." (verb second).
    de_c = (de_c[0], de_c[1], de_c[2][1:], de_c[3])
    return _finish([adverb[0]] + en_main, "."), _finish(
        [adverb[1]] + _de_order(de_c, "inverted"), ".")
  if adverb is not None:
    en_main.append(adverb[0])
  return _finish(en_main, "."), _finish(_de_order(de_c, "v2"), ".")


def _finish(words: list[str], punct: str) -> str:
  text = " ".join(w for w in words if w).replace(" ,", ",") + punct
  return text[0].upper() + text[1:]


def sample_pair(rng: random.Random) -> tuple[str, str]:
  """One (english, german) sentence pair drawn from the grammar."""
  return _realise(rng)


def generate_splits(seed: int = 0, num_train: int = 200_000,
                    num_eval: int = 1_000) -> dict[str, list[tuple[str, str]]]:
  """Deterministic splits of unique (english, german) pairs.

  Returns {'train': [...num_train], 'validation': [...num_eval],
  'test': [...num_eval]}; no source or target sentence occurs in two splits
  (or twice in one). The same seed gives the same pairs in the same order.
  """
  if num_train < 1 or num_eval < 0:
    raise UserError(f"num_train={num_train} and num_eval={num_eval} must be "
                    ">= 1 and >= 0; pass positive sizes")
  total = num_train + 2 * num_eval
  rng = random.Random(seed)
  seen_en, seen_de, pairs = set(), set(), []
  attempts = 0
  while len(pairs) < total:
    attempts += 1
    if attempts > 20 * total + 1000:
      raise UserError(f"the toy grammar gave only {len(pairs)} unique pairs of "
                      f"the {total} asked for; lower num_generated_train")
    en, de = _realise(rng)
    if en.count(" ") >= _MAX_WORDS or de.count(" ") >= _MAX_WORDS:
      continue
    if en in seen_en or de in seen_de:
      continue
    seen_en.add(en)
    seen_de.add(de)
    pairs.append((en, de))
  # Shuffle before splitting: later draws are biased to longer sentences
  # (the short ones are used up), so every split gets the same mixture.
  rng.shuffle(pairs)
  return {"test": pairs[:num_eval], "validation": pairs[num_eval:2 * num_eval],
          "train": pairs[2 * num_eval:]}
