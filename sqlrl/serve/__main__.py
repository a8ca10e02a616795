"""python -m sqlrl.serve --model models/final --host 127.0.0.1 --port 8000"""

from sqlrl.serve.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
