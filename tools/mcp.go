package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Caller runs one tool call, as the daemon's control socket does.
type Caller func(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error)

// NewMCPServer is an MCP server exposing exactly the tools in Tools, each
// call forwarded to call. A tool's failure comes back as a result with
// isError set and the structured error as its text, so the model sees it;
// only a failure to reach the daemon is a protocol error.
//
// With readOnly (every path of the mount is read-only), only the tools
// that change nothing are listed, as Mastra's readOnly does. Every tool
// carries MCP's readOnlyHint, destructiveHint and idempotentHint.
func NewMCPServer(version string, call Caller, readOnly bool) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "amlfs", Version: version}, nil)
	for _, t := range Tools {
		ro, destructive, idempotent := Hints(t.Name)
		if readOnly && !ro {
			continue
		}
		ann := &mcp.ToolAnnotations{ReadOnlyHint: ro, DestructiveHint: &destructive, IdempotentHint: idempotent, OpenWorldHint: new(bool)}
		s.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, Annotations: ann},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				var out json.RawMessage
				var err error
				if n, ok := frameTooLarge(req.Params.Arguments); ok {
					err = &Error{Code: CodeTooLarge, Message: fmt.Sprintf("the call's frame was %d bytes, over the %d an MCP call may take: write large files in parts, or through the shell", n, MaxFrameBytes)}
				} else {
					out, err = call(ctx, t.Name, req.Params.Arguments)
				}
				if err != nil {
					var te *Error
					if !errors.As(err, &te) {
						return nil, err
					}
					data, _ := json.Marshal(amlerr.Envelope{Error: te.Body()})
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}}, nil
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(out)}}, StructuredContent: out}, nil
			})
	}
	return s
}
