package format

import (
	"strings"
	"unicode/utf8"

	"github.com/amlfs/amlfs/amlerr"
)

// ValidateID checks a workspace id as AML does ("Workspace storage id must
// be a non-empty normalized string"): not empty, valid UTF-8 (JavaScript's
// encodeURIComponent throws on a lone surrogate), and unchanged by
// JavaScript's String.prototype.trim. An id AML refuses is refused here
// too, so that no workspace exists that AML cannot open.
func ValidateID(id string) error {
	bad := func(why string) error {
		return amlerr.New(amlerr.InvalidConfig, id, "workspace id %s; AML refuses it (it must be a non-empty normalized string)", why)
	}
	switch {
	case id == "":
		return bad("is empty")
	case !utf8.ValidString(id):
		return bad("is not valid UTF-8")
	}
	first, _ := utf8.DecodeRuneInString(id)
	last, _ := utf8.DecodeLastRuneInString(id)
	if jsSpace(first) || jsSpace(last) {
		return bad("begins or ends with white space")
	}
	return nil
}

// jsSpace reports whether String.prototype.trim removes r: ECMAScript's
// WhiteSpace (with every Unicode Zs) and LineTerminator.
func jsSpace(r rune) bool {
	switch {
	case r >= 0x09 && r <= 0x0D, r == 0x20, r == 0xA0, r == 0x1680, r >= 0x2000 && r <= 0x200A,
		r == 0x2028, r == 0x2029, r == 0x202F, r == 0x205F, r == 0x3000, r == 0xFEFF:
		return true
	}
	return false
}

// Seg returns the store path segment for a workspace id, exactly as AML
// computes it: JavaScript's encodeURIComponent, with ! ' ( ) * also escaped,
// and an id that encodes to "." or ".." written with %2E.
func Seg(id string) (string, error) {
	if err := ValidateID(id); err != nil {
		return "", err
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	s := b.String()
	switch s {
	case ".":
		return "%2E", nil
	case "..":
		return "%2E%2E", nil
	}
	return s, nil
}
