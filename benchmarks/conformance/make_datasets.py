"""Writes the two conformance datasets: `multiple_choice.jsonl` and `arithmetic.jsonl`.

Why generated here and not downloaded: the benchmark must run offline, and GPQA itself
is gated and far beyond a 270M base model. These stand in for it (multiple choice,
Appendix D of the paper) and for GSM-style word problems (an integer answer that the
model has to compute, so reasoning before answering matters).

  multiple_choice.jsonl  hand-written science / general-knowledge questions, four
                         options A-D; the correct option's position is balanced over
                         A-D by a seeded shuffle.
  arithmetic.jsonl       templated one- and two-step word problems whose integer answer
                         is computed from the sampled numbers.

Deterministic (fixed seed, no clock): rerunning rewrites identical files.
  python benchmarks/conformance/make_datasets.py
"""

import argparse
import json
import os
import random

_HERE = os.path.dirname(os.path.abspath(__file__))
LETTERS = "ABCD"

# (question, correct option, three wrong options). None of these is a few-shot example
# in run.py.
MC_QUESTIONS = (
    ("What gas do plants absorb from the air for photosynthesis?", "Carbon dioxide",
     ("Oxygen", "Nitrogen", "Helium")),
    ("What is the chemical symbol for gold?", "Au", ("Ag", "Gd", "Go")),
    ("How many legs does an insect have?", "Six", ("Four", "Eight", "Ten")),
    ("What is the boiling point of water at sea level in degrees Celsius?", "100",
     ("50", "90", "212")),
    ("Which organ pumps blood through the human body?", "The heart",
     ("The liver", "The lungs", "The kidneys")),
    ("What is the largest planet in the Solar System?", "Jupiter",
     ("Earth", "Mars", "Mercury")),
    ("Which particle carries a negative electric charge?", "Electron",
     ("Proton", "Neutron", "Photon")),
    ("What is the chemical formula of water?", "H2O", ("CO2", "NaCl", "O2")),
    ("Which force keeps the planets in orbit around the Sun?", "Gravity",
     ("Magnetism", "Friction", "Static electricity")),
    ("What is the freezing point of water in degrees Celsius?", "0", ("10", "-10", "32")),
    ("Which planet is closest to the Sun?", "Mercury", ("Venus", "Earth", "Neptune")),
    ("What part of the cell contains most of its genetic material?", "The nucleus",
     ("The cell wall", "The ribosome", "The vacuole")),
    ("What is the main gas in the air we breathe?", "Nitrogen",
     ("Oxygen", "Carbon dioxide", "Argon")),
    ("Which of these animals is a mammal?", "Dolphin", ("Shark", "Trout", "Octopus")),
    ("What is the hardest natural substance?", "Diamond", ("Gold", "Iron", "Quartz")),
    ("How many days does the Earth take to orbit the Sun?", "About 365",
     ("About 30", "About 100", "About 1000")),
    ("What do bees make from nectar?", "Honey", ("Milk", "Silk", "Wax paper")),
    ("Which vitamin does the skin make in sunlight?", "Vitamin D",
     ("Vitamin A", "Vitamin C", "Vitamin K")),
    ("What is the center of an atom called?", "The nucleus",
     ("The shell", "The orbit", "The cloud")),
    ("Which blood cells carry oxygen?", "Red blood cells",
     ("White blood cells", "Platelets", "Nerve cells")),
    ("What is the speed of light in vacuum, approximately?", "300,000 km per second",
     ("300 km per second", "3,000 km per hour", "30 m per second")),
    ("Which metal is liquid at room temperature?", "Mercury",
     ("Iron", "Aluminium", "Copper")),
    ("What is the largest ocean on Earth?", "The Pacific Ocean",
     ("The Atlantic Ocean", "The Indian Ocean", "The Arctic Ocean")),
    ("How many bones are in the adult human body?", "206", ("106", "306", "56")),
    ("Which gas do humans breathe out as waste?", "Carbon dioxide",
     ("Oxygen", "Hydrogen", "Neon")),
    ("What is the pH of pure water?", "7", ("1", "14", "10")),
    ("Which planet has the most famous rings?", "Saturn", ("Mars", "Venus", "Mercury")),
    ("What type of energy does a moving car have?", "Kinetic energy",
     ("Nuclear energy", "Chemical bonds only", "No energy")),
    ("What is the process by which water vapor becomes liquid?", "Condensation",
     ("Evaporation", "Melting", "Sublimation")),
    ("Which organ do humans use to breathe?", "The lungs",
     ("The stomach", "The heart", "The skin only")),
    ("What is the closest star to the Earth?", "The Sun",
     ("Sirius", "Polaris", "Betelgeuse")),
    ("How many continents are there on Earth?", "Seven", ("Five", "Six", "Nine")),
    ("What is the SI unit of force?", "Newton", ("Joule", "Watt", "Pascal")),
    ("What is the SI unit of electric current?", "Ampere", ("Volt", "Ohm", "Tesla")),
    ("Which element has the atomic number 1?", "Hydrogen",
     ("Helium", "Oxygen", "Carbon")),
    ("What do we call animals that eat only plants?", "Herbivores",
     ("Carnivores", "Omnivores", "Predators")),
    ("What is the tallest mountain on Earth above sea level?", "Mount Everest",
     ("Mont Blanc", "Mount Kilimanjaro", "Mount Fuji")),
    ("Which natural satellite orbits the Earth?", "The Moon",
     ("Phobos", "Titan", "Europa")),
    ("What is the square root of 81?", "9", ("8", "7", "18")),
    ("How many sides does a hexagon have?", "Six", ("Five", "Seven", "Eight")),
    ("What is 15 multiplied by 4?", "60", ("45", "19", "75")),
    ("Which shape has three sides?", "Triangle", ("Square", "Circle", "Pentagon")),
    ("What is the longest river in Africa?", "The Nile",
     ("The Amazon", "The Danube", "The Thames")),
    ("What is the capital city of France?", "Paris", ("Rome", "Berlin", "Madrid")),
    ("What is the capital city of Japan?", "Tokyo", ("Beijing", "Seoul", "Bangkok")),
    ("Which instrument measures temperature?", "Thermometer",
     ("Barometer", "Ruler", "Compass")),
    ("Which instrument shows the direction of north?", "Compass",
     ("Thermometer", "Microscope", "Scale")),
    ("What do plants release into the air during photosynthesis?", "Oxygen",
     ("Carbon dioxide", "Methane", "Smoke")),
    ("What is the main source of energy for life on Earth?", "The Sun",
     ("The Moon", "Volcanoes", "Wind")),
    ("What state of matter has a fixed shape?", "Solid", ("Liquid", "Gas", "Plasma")),
    ("What is frozen water called?", "Ice", ("Steam", "Fog", "Dew")),
    ("Which sense organ is used for hearing?", "The ear",
     ("The nose", "The tongue", "The eye")),
    ("Which of these is a renewable energy source?", "Wind",
     ("Coal", "Oil", "Natural gas")),
    ("How many hours are there in a day?", "24", ("12", "48", "60")),
    ("What is the largest organ of the human body?", "The skin",
     ("The liver", "The brain", "The heart")),
    ("Which simple machine is a ramp?", "Inclined plane",
     ("Pulley", "Lever", "Wheel and axle")),
    ("What does DNA stand for?", "Deoxyribonucleic acid",
     ("Dinitrogen acid", "Digital nucleic array", "Double nitrate acid")),
    ("Which scientist proposed the theory of general relativity?", "Albert Einstein",
     ("Isaac Newton", "Charles Darwin", "Marie Curie")),
    ("What is the chemical symbol for sodium?", "Na", ("So", "Sd", "S")),
    ("How many minutes are there in one hour?", "60", ("30", "100", "24")),
)

NAMES = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jack",
         "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "stamps", "cards")


def _arith_problem(rng: random.Random, kind: int) -> tuple[str, int]:
  """One word problem of template `kind` and its integer answer."""
  name = rng.choice(NAMES)
  item = rng.choice(ITEMS)
  a, b = rng.randint(3, 12), rng.randint(2, 9)
  c = rng.randint(2, a * b - 1)
  if kind == 0:
    a, b = rng.randint(10, 60), rng.randint(5, 40)
    return f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?", a + b
  if kind == 1:
    a, b = rng.randint(20, 90), rng.randint(3, 19)
    return (f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} "
            f"does {name} have left?"), a - b
  if kind == 2:
    return f"A box holds {a} {item}. How many {item} are in {b} boxes?", a * b
  if kind == 3:
    return (f"{name} shares {a * b} {item} equally among {b} friends. How many {item} "
            f"does each friend get?"), a
  if kind == 4:
    return (f"{name} buys {a} packs of {item} with {b} {item} in each pack and then gives "
            f"away {c} {item}. How many {item} does {name} have now?"), a * b - c
  if kind == 5:
    bill = (a * b // 10 + 1) * 10 + rng.choice((0, 10, 20))
    return (f"A ticket costs {a} dollars. {name} buys {b} tickets and pays with {bill} "
            f"dollars. How many dollars of change does {name} get?"), bill - a * b
  if kind == 6:
    return (f"{name} reads {a} pages each day for {b} days and then reads {c} more pages. "
            f"How many pages does {name} read in total?"), a * b + c
  return (f"A hall has {a} rows of chairs with {b} chairs in each row. {c} chairs are "
          f"empty. How many chairs are taken?"), a * b - c


def multiple_choice(seed: int) -> list[dict]:
  """MC records with the correct option's position balanced over A-D (seeded)."""
  rng = random.Random(seed)
  slots = [i % 4 for i in range(len(MC_QUESTIONS))]
  rng.shuffle(slots)
  records = []
  for i, ((question, right, wrong), slot) in enumerate(zip(MC_QUESTIONS, slots)):
    wrong = list(wrong)
    rng.shuffle(wrong)
    options = wrong[:slot] + [right] + wrong[slot:]
    records.append({"id": f"mc-{i:03d}", "question": question,
                    "options": dict(zip(LETTERS, options)), "answer": LETTERS[slot]})
  return records


def arithmetic(seed: int, count: int) -> list[dict]:
  """Arithmetic records cycling through the eight templates."""
  rng = random.Random(seed)
  records = []
  for i in range(count):
    question, answer = _arith_problem(rng, i % 8)
    assert answer >= 0, (question, answer)
    records.append({"id": f"arith-{i:03d}", "question": question, "answer": str(answer)})
  return records


def _write_jsonl(path: str, records: list[dict]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
  print(f"wrote {len(records)} records to {path}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seed", type=int, default=20240601)
  parser.add_argument("--arithmetic-count", type=int, default=64)
  parser.add_argument("--out-dir", default=_HERE)
  args = parser.parse_args()
  _write_jsonl(os.path.join(args.out_dir, "multiple_choice.jsonl"), multiple_choice(args.seed))
  _write_jsonl(os.path.join(args.out_dir, "arithmetic.jsonl"),
               arithmetic(args.seed + 1, args.arithmetic_count))


if __name__ == "__main__":
  main()
