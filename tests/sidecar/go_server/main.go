// Command goserver is an MCP server on the official Go SDK (1.8), as its README shows one:
// NewServer, AddTool and the Streamable HTTP handler, stateful, no event store. Nothing here
// knows about mcp-epoch: the sidecar's tests put it behind `mcp-epoch proxy`.
//
//	goserver -port 0 -name g1
//
// prints one JSON line ({"port", "pid", "name"}) once it listens. Its tool `work` is the
// demo's: `steps` progress notifications, an elicitation every `ask_every` steps, and a
// token `uid|call|kind|n|name` in every message.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type workArgs struct {
	UID        string  `json:"uid"`
	Call       string  `json:"call"`
	Steps      int     `json:"steps"`
	Interval   float64 `json:"interval"`
	AskEvery   int     `json:"ask_every,omitempty"`
	CloseEvery int     `json:"close_every,omitempty"`
}

type echoArgs struct {
	Text string `json:"text"`
}

func main() {
	port := flag.Int("port", 0, "port (0: a free one)")
	host := flag.String("host", "127.0.0.1", "address to listen on")
	name := flag.String("name", "go", "the replica's name, in every token")
	flag.Parse()
	token := func(a workArgs, kind string, n int) string {
		return strings.Join([]string{a.UID, a.Call, kind, fmt.Sprint(n), *name}, "|")
	}

	server := mcp.NewServer(&mcp.Implementation{Name: "mcp-epoch-demo", Version: "1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "work", Description: "Stream progress, ask now and then."},
		func(ctx context.Context, req *mcp.CallToolRequest, a workArgs) (*mcp.CallToolResult, any, error) {
			progressToken := req.Params.GetProgressToken()
			asks := 0
			for step := 1; step <= a.Steps; step++ {
				if progressToken != nil {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: progressToken, Progress: float64(step), Total: float64(a.Steps),
						Message: token(a, "step", step),
					})
				}
				if a.AskEvery > 0 && step%a.AskEvery == 0 {
					asks++
					asked := token(a, "ask", asks)
					answer, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
						Message: asked,
						RequestedSchema: map[string]any{
							"type":       "object",
							"properties": map[string]any{"token": map[string]any{"type": "string"}},
							"required":   []string{"token"},
						},
					})
					if err != nil {
						return nil, nil, err
					}
					if answer.Action != "accept" || answer.Content["token"] != asked {
						return nil, nil, fmt.Errorf("answer to %s was %v", asked, answer)
					}
				}
				select {
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				case <-time.After(time.Duration(a.Interval * float64(time.Second))):
				}
			}
			text := token(a, "done", a.Steps)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Echo a text."},
		func(ctx context.Context, req *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
		})

	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	mux := http.NewServeMux()
	mux.Handle("/mcp", handler)
	listener, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(2)
	}
	line, _ := json.Marshal(map[string]any{
		"port": listener.Addr().(*net.TCPAddr).Port, "pid": os.Getpid(), "name": *name,
	})
	fmt.Println(string(line))
	if err := (&http.Server{Handler: mux}).Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(2)
	}
}
