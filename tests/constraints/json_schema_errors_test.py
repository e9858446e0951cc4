"""JSON Schema errors: every error path of `cd.JsonSchema` (a table of schema, error
type and message), malformed values, spec arguments, the error hierarchy, and the size
budgets that raise before anything is built.
"""

import pytest

import constrained_decoding as cd


ERROR_CASES = [
    ({"type": "array", "uniqueItems": True}, cd.UnsupportedSchemaError,
     r"uniqueItems at #/uniqueItems needs items with at most 8 possible values"),
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
     cd.UnsupportedSchemaError, r"uniqueItems at #/properties/tags/uniqueItems needs items"),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
      "uniqueItems": True}, cd.UnsupportedSchemaError, r"at most 8 possible values"),
    ({"type": "array", "prefixItems": [{"const": 1}], "items": {"type": "number"},
      "uniqueItems": True}, cd.UnsupportedSchemaError, r"prefixItems count too"),
    ({"type": "array", "uniqueItems": 1}, cd.SchemaError,
     r"uniqueItems at #/uniqueItems is 1. Expected true or false"),
    ({"type": "array", "items": {"const": 1}, "uniqueItems": True, "minItems": 2},
     cd.SchemaError, r"accepts no JSON value"),
    ({"properties": {"a/b~c": {"not": {"patternProperties": {"x": {"type": "string"}}}}}},
     cd.UnsupportedSchemaError,
     r"not at #/properties/a~1b~0c/not/patternProperties cannot be enforced exactly"),
    ({"not": {"type": "array", "uniqueItems": True}}, cd.UnsupportedSchemaError,
     r"not at #/not/uniqueItems cannot be enforced exactly: an array with a repeated"),
    ({"$defs": {"t": {"properties": {"k": {"$ref": "#/$defs/t"}}}},
      "not": {"$ref": "#/$defs/t"}},
     cd.UnsupportedSchemaError, r"it negates the recursive \$ref '#/\$defs/t'"),
    ({"not": {"enum": [[1]]}}, cd.UnsupportedSchemaError, r"excluding array values"),
    ({"type": "object", "dependentSchemas": []}, cd.SchemaError,
     r"dependentSchemas at #/dependentSchemas is \[\]. Expected an object"),
    ({"not": 3}, cd.SchemaError, r"Schema 3 at #/not is a int"),
    ({"type": "array", "contains": {}, "uniqueItems": True}, cd.UnsupportedSchemaError,
     r"contains at #/contains next to uniqueItems is not supported"),
    ({"unevaluatedProperties": False, "not": {"patternProperties": {"^a": {}}}},
     cd.UnsupportedSchemaError,
     r"unevaluatedProperties at #/unevaluatedProperties next to not or if"),
    ({"type": "integer", "multipleOf": 3.000001},
     cd.UnsupportedSchemaError, r"multipleOf 3.000001 at #/multipleOf .* too large"),
    ({"type": "integer", "multipleOf": -2}, cd.SchemaError, r"multipleOf -2 at #/multipleOf is"),
    ({"type": "object", "minProperties": 2, "patternProperties": {"^x": {}}},
     cd.UnsupportedSchemaError,
     r"minProperties 2 at #/minProperties needs 2 additional properties with distinct keys"),
    ({"type": "object", "minProperties": 65}, cd.UnsupportedSchemaError,
     r"minProperties 65 at #/minProperties .* a row keeps the hashes of at most 64 keys"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False,
      "minProperties": 2}, cd.SchemaError, r"accepts no JSON value"),
    ({"type": "object", "maxProperties": -1}, cd.SchemaError,
     r"maxProperties -1 at #/maxProperties is not a non-negative integer"),
    ({"type": "object", "patternProperties": {c: {} for c in "abcdefg"}},
     cd.UnsupportedSchemaError,
     r"patternProperties at #/patternProperties: keys match more than 64 distinct sets"),
    ({"type": "object", "patternProperties": {f"^{i}$": {} for i in range(65)}},
     cd.UnsupportedSchemaError,
     r"patternProperties at #/patternProperties has 65 patterns. Expected at most 64"),
    ({"type": "object", "patternProperties": ["^x"]}, cd.SchemaError,
     r"patternProperties at #/patternProperties is \[\"\^x\"\]. Expected an object"),
    ({"type": "object", "patternProperties": {"(": {}}}, cd.SchemaError,
     r"pattern '\(' at #/patternProperties/\( is not a valid"),
    ({"type": "object", "propertyNames": {"$ref": "#/$defs/a"},
      "$defs": {"a": {"not": {"$ref": "#/$defs/a"}}}}, cd.UnsupportedSchemaError,
     r"refers back to itself"),
    ({"type": "object", "propertyNames": {"enum": "a"}}, cd.SchemaError,
     r"enum at #/propertyNames/enum is \"a\". Expected an array"),
    ({"allOf": [{"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
                {"properties": {"a": {}}}]},
     cd.UnsupportedSchemaError, r"allOf at #/allOf combines patternProperties with another"),
    ({"type": "object", "required": ["Zed"], "propertyNames": {"pattern": "^[a-z]+$"}},
     cd.SchemaError, r"accepts no JSON value"),
    ({"type": "strin"}, cd.SchemaError, r"type \"strin\" at #/type is not a JSON Schema type"),
    ({"$ref": "#/$defs/missing"},
     cd.SchemaError, r"\$ref '#/\$defs/missing' at #/\$ref does not resolve"),
    ({"$ref": "http://example.com/s.json"},
     cd.UnsupportedSchemaError, r"is not a local JSON pointer"),
    ({"$ref": 3}, cd.SchemaError, r"\$ref 3 at #/\$ref is not a string"),
    ({"type": "string", "pattern": "(?=a)"}, cd.UnsupportedSchemaError,
     r"pattern '\(\?=a\)' at #/pattern cannot be compiled"),
    ({"type": "string", "pattern": "a(?<=b)"},
     cd.UnsupportedSchemaError, r"at #/pattern cannot be compiled: .*lookbehind"),
    ({"type": "string", "pattern": "a^b"},
     cd.UnsupportedSchemaError, r"\^ and \$ belong at the start and end"),
    ({"type": "string", "pattern": "(^a|b)c"}, cd.UnsupportedSchemaError, r"pattern '\(\^a\|b\)c'"),
    ({"type": "string", "pattern": "(?x)a b"}, cd.UnsupportedSchemaError, r"verbose flag"),
    ({"type": "string", "pattern": "("},
     cd.SchemaError, r"pattern '\(' at #/pattern is not a valid"),
    ({"type": "string", "pattern": 5}, cd.SchemaError, r"pattern 5 at #/pattern is not a string"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 100_000}, cd.UnsupportedSchemaError,
     r"string constraints at # \(pattern, format, lengths\) are too large to combine"),
    ({"type": "number", "minimum": 2.5, "exclusiveMaximum": 2.5}, cd.SchemaError,
     r"accepts no JSON value"),
    ({"enum": [{"a": 1}], "properties": {"a": {}}}, cd.UnsupportedSchemaError,
     r"'properties' at #/properties is combined with enum/const"),
    ({"enum": ["abc"], "maxLength": 2}, cd.SchemaError, r"accepts no JSON value"),
    ({"enum": "a"}, cd.SchemaError, r"enum at #/enum is \"a\". Expected an array"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, cd.SchemaError, r"accepts no JSON value"),
    ({"enum": [1, 2], "type": "string"}, cd.SchemaError, r"accepts no JSON value"),
    (False, cd.SchemaError, r"JSON Schema false accepts no JSON value"),
    ({"type": "object", "additionalProperties": False,
      "allOf": [{"properties": {"a": {}}, "required": ["a"]}]},
     cd.SchemaError, r"accepts no JSON value"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, cd.SchemaError,
     r"accepts no JSON value"),
    ({"type": "string", "minLength": -1},
     cd.SchemaError, r"minLength -1 at #/minLength is not a non-negative"),
    ({"type": "array", "maxItems": 1.5}, cd.SchemaError, r"maxItems 1.5 at #/maxItems"),
    ({"type": "object", "required": "a"}, cd.SchemaError, r"required at #/required is \"a\""),
    ({"type": "object", "properties": [1]}, cd.SchemaError, r"properties at #/properties is \[1\]"),
    ({"properties": {"a": 5}}, cd.SchemaError, r"Schema 5 at #/properties/a is a int"),
    ({"type": "array", "prefixItems": {}}, cd.SchemaError, r"prefixItems at #/prefixItems"),
    ({"anyOf": []}, cd.SchemaError, r"anyOf at #/anyOf is \[\]. Expected a non-empty array"),
    ({"allOf": {}}, cd.SchemaError, r"allOf at #/allOf is \{\}"),
    ({"allOf": [{"pattern": "a"}, {"pattern": 5}]}, cd.SchemaError,
     r"pattern 5 at #/pattern is not a string"),
    ({"type": "string", "format": ["date"]}, cd.SchemaError,
     r"format \[\"date\"\] at #/format is not a string"),
    ({"allOf": [{"required": ["a"]}, {"required": "a"}]}, cd.SchemaError,
     r"allOf at #/allOf has 'required' values \[\"a\"\] and \"a\". Expected an array of names"),
    ({"allOf": [{"minimum": 0, "exclusiveMinimum": True},
                {"minimum": 1, "exclusiveMinimum": False}]},
     cd.UnsupportedSchemaError,
     r"allOf at #/allOf combines 'exclusiveMinimum' values true and false"),
    ({"type": "number", "exclusiveMinimum": True}, cd.SchemaError,
     r"exclusiveMinimum true at #/exclusiveMinimum has no minimum"),
    ({"type": "number", "maximum": "3"},
     cd.SchemaError, r"maximum '3' at #/maximum is not a number"),
    ({"items": [{}], "prefixItems": [{}]},
     cd.SchemaError, r"both prefixItems and array-form items"),
    ({"type": "object", "dependentRequired": {"a": "b"}}, cd.SchemaError,
     r"dependentRequired at #/dependentRequired is \{\"a\": \"b\"\}. Expected an object"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}, "minProperties": 1,
      "patternProperties": {"^x": {}}},
     cd.UnsupportedSchemaError, r"dependentRequired at #/dependentRequired next to"),
]


@pytest.mark.parametrize("schema, error, message", ERROR_CASES,
                         ids=[m[:40] for _, _, m in ERROR_CASES])
def test_error_messages(schema, error, message):
  with pytest.raises(error, match=message):
    cd.JsonSchema(schema).to_ir()


def test_bounded_recursion_without_a_base_case():
  schema = {"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                            "required": ["n"]}}, "$ref": "#/$defs/n"}
  with pytest.raises(cd.UnsupportedSchemaError, match=(
      r"Recursive \$ref '#/\$defs/n' has no non-recursive alternative within max_ref_depth=3")):
    cd.JsonSchema(schema, max_ref_depth=3).to_ir()


@pytest.mark.parametrize("schema, message", [
    ("{not json", r"JSON Schema text '\{not json' is not valid JSON"),
    (5, r"JSON Schema 5 is a int. Expected a dict"),
    ({"enum": [float("nan")]}, r"holds a value that is not JSON"),
    ({"enum": [{1, 2}]}, r"holds a value that is not JSON"),
])
def test_malformed_schema_values(schema, message):
  with pytest.raises(cd.SchemaError, match=message):
    cd.JsonSchema(schema)


@pytest.mark.parametrize("kwargs, message", [
    ({"whitespace": "pretty"}, r"Whitespace policy 'pretty' is not known"),
    ({"max_ref_depth": 0}, r"JsonSchema max_ref_depth 0 is not an int >= 1"),
    ({"free_form_depth": -1}, r"JsonSchema free_form_depth -1 is not an int >= 0"),
    ({"whitespace": "flexible", "max_whitespace": -2}, r"max_whitespace -2 is not a non-negative"),
])
def test_spec_argument_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    cd.JsonSchema({"type": "integer"}, **kwargs)


def test_errors_are_in_the_hierarchy():
  assert issubclass(cd.UnsupportedSchemaError, cd.UnsupportedFeatureError)
  assert issubclass(cd.SchemaError, cd.ConstraintError)


@pytest.mark.parametrize("schema, message", [
    ({"type": "string", "maxLength": 10**9},
     r"maxLength 1000000000 at #/maxLength needs an automaton of more than 100000 states"),
    ({"type": "array", "minItems": 200_000}, r"minItems 200000 at #/minItems needs"),
    ({"enum": list(range(30_000))}, r"enum at #/enum has 30000 values; expected at most 20000"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5_001)}},
     r"The object at # declares 5001 properties; expected at most 5000"),
])
def test_size_limits_raise_before_building(schema, message):
  with pytest.raises(cd.CompileBudgetError, match=message):
    cd.JsonSchema(schema).to_ir()


def test_deep_schemas_raise_a_budget_error():
  schema = {"type": "integer"}
  for _ in range(1000):
    schema = {"type": "array", "items": schema}
  with pytest.raises(cd.CompileBudgetError, match=r"nested too deeply for Python to walk"):
    cd.JsonSchema(schema).to_ir()
  with pytest.raises(cd.GrammarError, match=r"nests groups too deeply for the parser"):
    cd.Grammar("root ::= " + "(" * 600 + '"a"' + ")" * 600).grammar_ir()
  with pytest.raises(cd.CompileBudgetError, match=r"Grammar rule 'root' would expand"):
    cd.Grammar('root ::= "a"{100000000}').grammar_ir()
