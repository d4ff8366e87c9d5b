// Command toolcalls times file-tool calls against a mounted amlfs
// workspace through its control socket, as an agent's tool layer makes
// them: read_file, stat, list_files and write_file of small files. It
// prints one line per tool: the median microseconds per call.
//
//	go run ./bench/toolcalls -n 2000 MOUNTPOINT
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/amlfs/amlfs/mount"
)

func main() {
	n := flag.Int("n", 2000, "calls per tool")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: toolcalls [-n N] MOUNTPOINT")
		os.Exit(2)
	}
	ctx := context.Background()
	cl, err := mount.NewClient(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolcalls:", err)
		os.Exit(1)
	}
	call := func(name string, args map[string]any) {
		data, _ := json.Marshal(args)
		if _, err := cl.Tool(ctx, name, data); err != nil {
			fmt.Fprintf(os.Stderr, "toolcalls: %s: %v\n", name, err)
			os.Exit(1)
		}
	}
	for i := range 50 {
		call("write_file", map[string]any{"path": fmt.Sprintf("tc/f%d.txt", i), "content": "some small file's text\n"})
	}
	for _, tool := range []struct {
		name string
		args func(i int) map[string]any
	}{
		{"read_file", func(i int) map[string]any { return map[string]any{"path": fmt.Sprintf("tc/f%d.txt", i%50)} }},
		{"file_stat", func(i int) map[string]any { return map[string]any{"path": fmt.Sprintf("tc/f%d.txt", i%50)} }},
		{"list_files", func(i int) map[string]any { return map[string]any{"path": "tc"} }},
		{"write_file", func(i int) map[string]any {
			return map[string]any{"path": fmt.Sprintf("tc/w%d.txt", i%50), "content": fmt.Sprint("rewrite ", i)}
		}},
	} {
		times := make([]time.Duration, *n)
		for i := range *n {
			start := time.Now()
			call(tool.name, tool.args(i))
			times[i] = time.Since(start)
		}
		slices.Sort(times)
		fmt.Printf("%s %.1f\n", tool.name, float64(times[len(times)/2].Microseconds()))
	}
}
