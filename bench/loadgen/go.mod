module mcp-epoch/bench/loadgen

go 1.22
