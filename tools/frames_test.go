package tools

import (
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestLimitFrames(t *testing.T) {
	big := strings.Repeat("x", 200_000)
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write_file","arguments":{"content":"` + big + `"}}}` + "\n"
	after := `{"jsonrpc":"2.0","id":"a\"b","method":"tools/call","params":{"arguments":{"content":"` + big + `"},"name":"edit_file"}}` + "\n"
	other := `{"jsonrpc":"2.0","id":3,"method":"x","params":"` + big + `"}` + "\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"small frames pass", "{\"id\":1}\n{\"id\":2}\n", "{\"id\":1}\n{\"id\":2}\n"},
		{"a last frame with no newline", "{\"id\":1}", "{\"id\":1}"},
		{"an oversized call", call + "{\"id\":8}\n",
			fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write_file","arguments":{"amlfs.frameTooLarge":%d}}}`, len(call)) + "\n{\"id\":8}\n"},
		{"the name after the arguments", after,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":"a\"b","method":"tools/call","params":{"name":"edit_file","arguments":{"amlfs.frameTooLarge":%d}}}`, len(after)) + "\n"},
		{"another method", other,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"amlfs/frameTooLarge","params":{"bytes":%d}}`, len(other)) + "\n"},
		{"a notification is dropped", `{"jsonrpc":"2.0","method":"x","params":"` + big + `"}` + "\n{\"id\":9}\n", "{\"id\":9}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := io.ReadAll(LimitFrames(strings.NewReader(tc.in), 100_000))
			if err != nil || string(got) != tc.want {
				t.Errorf("got %.300q, %v\nwant %.300q", got, err, tc.want)
			}
			if n, ok := frameTooLarge([]byte(`{"amlfs.frameTooLarge":200098}`)); !ok || n != 200098 {
				t.Errorf("frameTooLarge: %d %v", n, ok)
			}
		})
	}
}
