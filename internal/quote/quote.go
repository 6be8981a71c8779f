// Package quote quotes a caller's value for an error message, clipped: a
// message of kvxfer's may end in a C caller's 1023-byte buffer
// (kvxfer_last_error), and the reason that follows the value must fit.
package quote

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Max is how many bytes of a value a message quotes.
const Max = 64

// String is s quoted (strconv.Quote, as %q) when it is at most Max bytes;
// a longer one shows its first bytes (cut at a character boundary), an
// ellipsis and its length: "aaaa"… (1500 bytes).
func String(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:cut(s)]) + fmt.Sprintf("… (%d bytes)", len(s))
}

// Raw is s unquoted (as %s) when it is at most Max bytes; a longer one
// is clipped as String clips it, unquoted: aaaa… (1500 bytes).
func Raw(s string) string {
	if len(s) <= Max {
		return s
	}
	return s[:cut(s)] + fmt.Sprintf("… (%d bytes)", len(s))
}

// JSONValue is a JSON value as written (raw) when it is at most Max bytes;
// a longer string is clipped as String clips it, a longer other value as
// Raw does.
func JSONValue(raw []byte) string {
	if len(raw) <= Max {
		return string(raw)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return String(s)
	}
	return Raw(string(raw))
}

// cut is where a value longer than Max is cut: at most Max bytes, not
// inside a character.
func cut(s string) int {
	c := Max
	for c > 0 && !utf8.RuneStart(s[c]) {
		c--
	}
	return c
}

// In is err with value clipped in its message: every quoted copy of value
// (as %q writes it) becomes String(value), and every other copy
// Raw(value). err itself when value is at most Max bytes, or its message
// does not hold it; errors.Is and errors.As see through the result. For an
// error of another package that names the value whole (net's address
// errors, a preset's name).
func In(err error, value string) error {
	if err == nil || len(value) <= Max {
		return err
	}
	msg := err.Error()
	if !strings.Contains(msg, value) {
		return err
	}
	return &clipped{msg: InText(msg, value), err: err}
}

// InText is msg with value clipped as In clips it.
func InText(msg, value string) string {
	if len(value) <= Max || !strings.Contains(msg, value) {
		return msg
	}
	msg = strings.ReplaceAll(msg, strconv.Quote(value), String(value))
	return strings.ReplaceAll(msg, value, Raw(value))
}

// JSON is a decoding error of encoding/json with the unknown field it
// names clipped (json: unknown field "…"), otherwise err itself.
func JSON(err error) error {
	if err == nil {
		return nil
	}
	const prefix = `json: unknown field `
	msg := err.Error()
	i := strings.Index(msg, prefix)
	if i < 0 {
		return err
	}
	q, qerr := strconv.QuotedPrefix(msg[i+len(prefix):])
	if qerr != nil {
		return err
	}
	field, qerr := strconv.Unquote(q)
	if qerr != nil {
		return err
	}
	return In(err, field)
}

// clipped is an error whose message clips a value its cause names whole.
type clipped struct {
	msg string
	err error
}

func (e *clipped) Error() string { return e.msg }
func (e *clipped) Unwrap() error { return e.err }
