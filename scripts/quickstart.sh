#!/usr/bin/env bash
# Set up, serve the default model on 127.0.0.1:8000, wait until it is ready, ask it one chat
# question through the official openai client, print the answer, and stop the server.
#   PORT=8001 ./scripts/quickstart.sh [mtpserve serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
PORT=${PORT:-8000}
# another server on the port would answer in place of ours
python -c "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1])))" "$PORT" \
  2>/dev/null || { echo "port $PORT is in use; choose another: PORT=8001 $0" >&2; exit 1; }
mtpserve serve --port "$PORT" "$@" > quickstart-server.log 2>&1 &
SERVER=$!
# exit with the script's own status, not the stopped server's
trap 'rc=$?; kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; exit $rc' EXIT
mtpserve wait-ready --url "http://127.0.0.1:$PORT" --timeout 300 --pid $SERVER \
  || { cat quickstart-server.log; exit 1; }
kill -0 $SERVER 2>/dev/null || { echo "the server exited:" >&2; cat quickstart-server.log; exit 1; }
python - "$PORT" <<'PY'
import sys
from openai import OpenAI
client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
model = client.models.list().data[0].id
question = "What is the capital of France? Answer in one sentence."
reply = client.chat.completions.create(model=model, max_tokens=48, temperature=0,
                                       messages=[{"role": "user", "content": question}])
print(f"model: {model}\nuser: {question}\nassistant: {reply.choices[0].message.content}")
print(f"usage: {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens")
PY
