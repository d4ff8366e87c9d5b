package revision

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
	} {
		got, err := Seg(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Seg(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "\xff"} {
		if _, err := Seg(bad); err == nil {
			t.Errorf("Seg(%q) accepted", bad)
		}
	}
}
