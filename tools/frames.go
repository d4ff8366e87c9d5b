package tools

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"regexp"
)

// MaxFrameBytes bounds one MCP frame (a JSON-RPC message on one line):
// a call's arguments at MaxArgsBytes, with room for the envelope.
const MaxFrameBytes = MaxArgsBytes + 1<<20

// tooLargeKey is the argument a frame over MaxFrameBytes is replaced by:
// the call then fails with TOO_LARGE, and the server lives on.
const tooLargeKey = "amlfs.frameTooLarge"

// LimitFrames passes newline-delimited JSON-RPC frames from r through,
// and replaces each frame over limit bytes, without ever holding more than
// limit of it, by a small one with the same id: a tools/call of the same
// tool whose one argument makes it fail with TOO_LARGE, or, for another
// method, a call of a method no server has (a "method not found" error).
// A frame with no id (a notification) is dropped. So an oversized request
// gets an answer, and the MCP server is never killed by one.
func LimitFrames(r io.Reader, limit int) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(copyFrames(pw, bufio.NewReaderSize(r, 64<<10), limit)) }()
	return pr
}

// The window kept of an oversized frame's head and tail, where its id,
// method and tool name are looked for.
const frameWindow = 64 << 10

var (
	frameID     = regexp.MustCompile(`"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")`)
	frameMethod = regexp.MustCompile(`"method"\s*:\s*"tools/call"`)
	frameName   = regexp.MustCompile(`"name"\s*:\s*("[a-z_]+")`)
)

func copyFrames(w io.Writer, br *bufio.Reader, limit int) error {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) <= limit {
			line = append(line, chunk...)
		} else {
			// Over the bound: keep the head and the tail, drop the
			// rest as it comes.
			head := append([]byte(nil), line[:min(len(line), frameWindow)]...)
			tail := chunk
			n := len(line) + len(chunk)
			for err == bufio.ErrBufferFull {
				chunk, err = br.ReadSlice('\n')
				n += len(chunk)
				tail = append(tail[max(0, len(tail)+len(chunk)-frameWindow):], chunk...)
			}
			if len(head) < frameWindow {
				head = append(head, tail[:min(len(tail), frameWindow-len(head))]...)
			}
			if sub := substitute(head, tail, n); sub != nil {
				if _, werr := w.Write(sub); werr != nil {
					return werr
				}
			}
			line = line[:0]
			if err != nil {
				return eofOK(err)
			}
			continue
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if len(line) > 0 {
			if _, werr := w.Write(line); werr != nil {
				return werr
			}
			line = line[:0]
		}
		if err != nil {
			return eofOK(err)
		}
	}
}

func eofOK(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}

// substitute is the small frame that stands for an oversized one of n
// bytes, whose head and tail are given; nil for a notification.
func substitute(head, tail []byte, n int) []byte {
	id := frameID.FindSubmatch(head)
	if id == nil {
		return nil
	}
	if frameMethod.Match(head) || frameMethod.Match(tail) {
		name := frameName.FindSubmatch(head)
		if name == nil {
			name = frameName.FindSubmatch(tail)
		}
		if name != nil {
			return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":%s,"arguments":{%q:%d}}}`+"\n", id[1], name[1], tooLargeKey, n)
		}
	}
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"method":"amlfs/frameTooLarge","params":{"bytes":%d}}`+"\n", id[1], n)
}

// frameTooLarge reports whether args stand for an oversized frame, and
// its size.
func frameTooLarge(args []byte) (int, bool) {
	if !bytes.Contains(args, []byte(tooLargeKey)) {
		return 0, false
	}
	var n int
	_, err := fmt.Sscanf(string(bytes.TrimSpace(args)), `{"`+tooLargeKey+`":%d}`, &n)
	return n, err == nil
}
