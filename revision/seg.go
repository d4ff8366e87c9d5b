package revision

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Seg returns the store path segment for a workspace id, exactly as AML
// computes it: JavaScript's encodeURIComponent, with ! ' ( ) * also escaped,
// and an id that encodes to "." or ".." written with %2E.
func Seg(id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("workspace id is empty")
	}
	if !utf8.ValidString(id) {
		// encodeURIComponent throws URIError on lone surrogates.
		return "", fmt.Errorf("workspace id %q is not valid UTF-8", id)
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
