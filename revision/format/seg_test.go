package format

import "testing"

func TestSeg(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"review-42", "review-42"},
		{"a b/c", "a%20b%2Fc"},
		{"it's(1)*!", "it%27s%281%29%2A%21"},
		{"~_.-", "~_.-"},
		{".", "%2E"},
		{"..", "%2E%2E"},
		{"...", "..."},
		{"é", "%C3%A9"},
		{"😀", "%F0%9F%98%80"},
		{"a?b#c&d=e+f", "a%3Fb%23c%26d%3De%2Bf"},
		{"100%", "100%25"},
		{"a b", "a%20b"},                           // inner white space is kept
		{"x\u200bz\u200b", "x%E2%80%8Bz%E2%80%8B"}, // zero-width space is not white space to trim
	} {
		got, err := Seg(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Seg(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	// Every id AML refuses: empty, or changed by JavaScript's trim.
	for _, bad := range []string{"", "\xff", " lead", "trail ", " ", "\n", "\t", "nbsp\u00a0", "\u3000ideo", "feff\ufeff", "\u1680x", "x\u2000", "x\u200a",
		"\u2028x", "x\u2029", "\u202fx", "x\u205f", "\rx", "x\v", "\fx"} {
		if _, err := Seg(bad); err == nil {
			t.Errorf("Seg(%q) accepted", bad)
		}
	}
}
