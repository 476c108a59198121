/*
 * json_schema.h — JSON Schema to regular expression: structured output. A schema (JSON text) is
 * compiled into a pattern of constraint.h's syntax whose every match is a JSON document that the
 * schema validates; the constraint built from that pattern makes a generation produce one. The
 * daemon takes the schema from Generate.json_schema (or the HTTP front end's response_format) and
 * compiles it through constraint_compile_cached_as(..., CONSTRAINT_JSON_SCHEMA, ...).
 *
 * The pattern may admit fewer documents than the schema (never more): it fixes a layout (below)
 * and bounds what the schema leaves open, so that the output always validates and a model cannot
 * wander. Everything a schema can say that it cannot honour is refused with an error naming the
 * place, as a JSON pointer into the schema ("json schema: #/properties/age/multipleOf: multipleOf
 * is not supported"), never ignored.
 *
 * Supported (JSON Schema 2020-12 and draft 7 spellings):
 *   type            "object" "array" "string" "number" "integer" "boolean" "null", or an array of
 *                   them (one of them). Without `type`, the types whose keywords appear (properties
 *                   -> object, items -> array, minLength -> string, minimum -> number...), or any
 *                   value when there are none.
 *   object          `properties` (each generated in the schema's order), `required` (those always,
 *                   the others optionally, still in that order), `additionalProperties`: the output
 *                   has the declared properties only, whatever additionalProperties says (false,
 *                   true, absent or a schema: extra properties are never needed to validate, and a
 *                   demanding caller wants the fields it declared, not invented ones). An object
 *                   schema without `properties` is a map: any keys, each value matching
 *                   `additionalProperties` (any JSON value when it is true or absent).
 *                   `unevaluatedProperties: false` holds by construction. Every name in `required`
 *                   must be in `properties`.
 *   array           `items` (one schema for every element; absent or true: any value),
 *                   `minItems`, `maxItems` (up to JSON_SCHEMA_MAX_COUNT).
 *   string          `minLength`/`maxLength` (characters, as JSON Schema counts them; up to
 *                   JSON_SCHEMA_MAX_COUNT), `pattern`, `format` date, time, date-time, uuid, email,
 *                   ipv4 (as regexes, below), `enum`/`const`. `pattern`, `format` and the lengths
 *                   go one at a time (a pattern with a length is refused).
 *   number/integer  `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers; draft
 * 4's boolean exclusiveMinimum/Maximum too), any combination. See "numbers". boolean, null
 * true/false, null. enum, const     any JSON values, written compactly (`{"a":1}`), filtered by
 * `type` if given. anyOf, oneOf    one of the branches. oneOf's branches must not overlap (checked
 * on their automata: an overlap is refused with an example the two share); use anyOf. allOf with
 * one branch (as pydantic writes a $ref with a description). $ref            "#" + a JSON pointer
 * into the same document: `#/$defs/Name`,
 *                   `#/definitions/Name`, or any other place. Annotations beside it are fine. A
 *                   recursive reference (one that reaches itself) is refused by name: the output
 *                   language of a recursive schema is not regular.
 *   nullable        (OpenAPI 3.0) true adds null to the types.
 *   {"type": "json_object"}  (the whole schema; OpenAI's response_format json_object): any JSON
 *                   object. Values a schema leaves open (`true`, `{}`, a subschema without type
 *                   keywords, an object's values without additionalProperties schema, an array's
 *                   items without `items`, json_object's values) are any JSON value whose
 *                   containers nest at most JSON_SCHEMA_ANY_DEPTH deep (so json_object's output
 *                   nests at most 3 deep): the pattern of an open value grows 4-fold per level.
 * Ignored: annotations (title, description, default, examples, $comment, $schema, $id at the root,
 * deprecated, readOnly, writeOnly, content*, $defs/definitions themselves), uniqueItems false, and
 * keywords JSON Schema does not define (vendor extensions: the standard says to ignore them).
 * Refused, by pointer: not, if/then/else, multipleOf, patternProperties, propertyNames,
 * min/maxProperties, dependentRequired/dependentSchemas/dependencies, prefixItems, contains,
 * uniqueItems true, unevaluatedItems, unevaluatedProperties other than false, $dynamicRef and the
 * anchors, remote $ref, format values other than the six, keywords beside anyOf/oneOf/$ref/enum
 * that restrict values (put them in each branch), `false` (it accepts nothing).
 *
 * Layout of the output. No whitespace around the document. Inside: after `{`, `[` and `,` either
 * nothing, one space, or a newline and up to JSON_SCHEMA_INDENT spaces per nesting level (at most
 * JSON_SCHEMA_MAX_INDENT); before `}` and `]` the same with one level less; after `:` nothing or
 * one space; none elsewhere. So both `{"a": 1, "b": [2]}` and a pretty-printed document fit, and a
 * generation cannot wander in whitespace. An empty object or array is `{}` / `[]`.
 *
 * Strings: exactly JSON's string syntax: any character but `"`, `\` and U+0000-U+001F as itself
 * (the pattern is over UTF-8 and admits only valid UTF-8), or the escapes \" \\ \/ \b \f \n \r \t
 * and \uXXXX (a surrogate only as a high-low pair, so the text decodes to valid Unicode). A
 * `pattern` is matched, as JSON Schema says, anywhere in the decoded string (a search; anchor it
 * with ^...$); its characters are written as themselves, the ones JSON must escape with their
 * short escape or \u00XX. Its syntax is constraint.h's (ECMAScript-like): literals, `.`, classes,
 * \d \w \s and negations, groups, `|`, quantifiers up to {1000}, `^` `$` at the ends of top-level
 * alternatives. Refused (by the regex compiler, named): backreferences, lookaround, \b \B, \p{..},
 * flags, anchors elsewhere. Note: \d \w \s are ASCII digits, ASCII word characters and Unicode
 * space, as in ECMAScript; \D \W \S are their complements, which a validator whose \d is Unicode's
 * (Python's re) may see differently for non-ASCII digits.
 * Formats: date YYYY-MM-DD (a real date: days per month, February 29 in leap years only); time
 * HH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM) (RFC 3339 full-time, seconds 00-59); date-time the two joined
 * by `T`; uuid 8-4-4-4-12 lowercase hex; email dot-atom local part @ dot-separated host labels of
 * letters, digits and inner hyphens, ending in a label of 2+ letters; ipv4 dotted quad 0-255
 * without leading zeros.
 *
 * Numbers. Integers are written without sign for >= 0 and without leading zeros; numbers
 * additionally with an optional fraction that does not end in 0 (`1.5`, not `1.50`). Without
 * bounds: at most JSON_SCHEMA_MAX_DIGITS digits before the point and as many after, and a number
 * (not an integer) may have an exponent e[+-]N (N 1-99): every value is a finite double and every
 * integer exact in one (and in int64), so consumers with fixed-size numbers (JavaScript, jansson)
 * read what was written. With any bound, no exponent, and at most
 * JSON_SCHEMA_MAX_DIGITS significant digits in all: then every value the pattern admits is a
 * different double and compares with the bounds as a validator comparing doubles sees it. Bounds
 * are expressed exactly (a digit-by-digit range, e.g. minimum 0.5 exclusiveMaximum 12 for a
 * number, or minimum -40 maximum 125 for an integer), whatever their combination: integer bounds up
 * to 10^18 in magnitude, number bounds below 10^15 in magnitude and with at most 30 digits after
 * the point (a bound outside is refused). A bound is read as the shortest decimal that gives its
 * double (0.1 is 0.1). Bounds that leave nothing (minimum 3 maximum 2) are refused.
 *
 * Limits: the schema text JSON_SCHEMA_MAX_BYTES; subschemas nested JSON_SCHEMA_MAX_DEPTH deep
 * (a $ref counts as a level); JSON_SCHEMA_MAX_NODES subschemas visited (each $ref use visits its
 * target again); counts (lengths, items) up to JSON_SCHEMA_MAX_COUNT; the pattern
 * JSON_SCHEMA_MAX_REGEX bytes; oneOf checks at most JSON_SCHEMA_MAX_ONEOF branches. Over one,
 * CORRAL_RESOURCE_EXHAUSTED naming the limit and the place. The regex compiler's own limits
 * (constraint.h) then bound the automaton: a schema within these limits can still make one too
 * large (a long maxItems of a big object), refused as "json schema: the schema is too complex:
 * <the regex compiler's message>".
 */
#ifndef CORRAL_JSON_SCHEMA_H
#define CORRAL_JSON_SCHEMA_H

#include <stddef.h>

#include "corral/status.h"

#define JSON_SCHEMA_MAX_BYTES  (256u << 10) /* schema text */
#define JSON_SCHEMA_MAX_DEPTH  24           /* nested subschemas, $ref included */
#define JSON_SCHEMA_MAX_NODES  20000        /* subschemas visited, $ref targets each time */
#define JSON_SCHEMA_MAX_COUNT  1000         /* minLength, maxLength, minItems, maxItems */
#define JSON_SCHEMA_MAX_REGEX  (256u << 10) /* the pattern written */
#define JSON_SCHEMA_MAX_ONEOF  16           /* branches of a oneOf (checked pairwise) */
#define JSON_SCHEMA_ANY_DEPTH  2            /* containers nested in a value left open */
#define JSON_SCHEMA_MAX_DIGITS 15           /* see "Numbers" above */
#define JSON_SCHEMA_INDENT     4            /* spaces per level after a newline, at most */
#define JSON_SCHEMA_MAX_INDENT 32           /* spaces after a newline, at most */

/* Compile schema[0..len) (JSON text: an object, or true) into a pattern (constraint.h syntax).
 * *regex receives it (malloc'ed, NUL-terminated; caller frees), *regex_len its length (may be
 * NULL). CORRAL_OK; CORRAL_INVALID_ARGUMENT for text that is not JSON ("json schema: line 1,
 * column 9: ...") and for a schema that is invalid or uses something unsupported (the message names
 * the JSON pointer, see above); CORRAL_RESOURCE_EXHAUSTED over a limit; CORRAL_OUT_OF_MEMORY.
 * *regex is NULL on failure. Time linear in the pattern written (oneOf's check apart, which
 * compiles its branches), bounded by the limits. Thread-safe. */
corral_status json_schema_to_regex(const char *schema, size_t len, char **regex, size_t *regex_len,
                                   corral_error *err);

#endif /* CORRAL_JSON_SCHEMA_H */
