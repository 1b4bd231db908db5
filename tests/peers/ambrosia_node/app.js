// A counter immortal on AMBROSIA's Node.js language binding, for the interop tests.
//
// It is the same immortal as wallaroo-proto's mock-lb: method 1 adds the argument's
// "value" (a JSON object, as mock-ic sends by default), and a multiple of 5 also makes
// a self call, method 2, that adds it once more when it comes back through the IC's
// log. Its state is checkpointed with the binding's simple checkpoint producer and
// consumer. After every message it writes what it knows to STATUS (a JSON file,
// replaced atomically), so a test can wait on its progress and read its totals.
//
// Run from a folder holding ambrosiaConfig.json (Separated mode): node app.js LIB STATUS
// where LIB is the built binding's lib/Ambrosia.js.
"use strict";
const fs = require("fs");
const [lib, statusPath] = process.argv.slice(2);
const Ambrosia = require(lib);
const IC = Ambrosia.IC;
const Messages = Ambrosia.Messages;
const Streams = Ambrosia.Streams;
const ADD = 1;
const BONUS = 2;

class AppState extends Ambrosia.AmbrosiaAppState {
    constructor(restored) {
        super(restored);
        this.rpcs = restored ? restored.rpcs : 0;
        this.total = restored ? restored.total : 0;
        this.bonuses = restored ? restored.bonuses : 0;
        this.initialized = restored ? restored.initialized : false;
    }
}

let state;
const seen = { events: [], checkpointsSaved: 0, checkpointsLoaded: 0, impulses: 0, primary: false };

function writeStatus() {
    const status = {
        rpcs: state.rpcs,
        total: state.total,
        bonuses: state.bonuses,
        initialized: state.initialized,
        ...seen,
    };
    fs.writeFileSync(statusPath + ".tmp", JSON.stringify(status));
    fs.renameSync(statusPath + ".tmp", statusPath);
}

function dispatcher(message) {
    if (message.type === Messages.DispatchedMessageType.RPC) {
        const rpc = message;
        const value = rpc.getJsonParam("value");
        state.rpcs += 1;
        state.total += value;
        if (rpc.rpcType === Messages.RPCType.Impulse) {
            seen.impulses += 1;
        }
        if (rpc.methodID === BONUS) {
            state.bonuses += 1;
        } else if (rpc.methodID === ADD && value % 5 === 0) {
            IC.callFork(config.icInstanceName, BONUS, { value: value });
        }
    } else if (message.type === Messages.DispatchedMessageType.AppEvent) {
        const name = Messages.AppEventType[message.eventType];
        seen.events.push(name);
        if (message.eventType === Messages.AppEventType.FirstStart) {
            state.initialized = true;
        } else if (message.eventType === Messages.AppEventType.BecomingPrimary) {
            seen.primary = true;
        }
    }
    writeStatus();
}

function checkpointProducer() {
    return Streams.simpleCheckpointProducer(state, (error) => {
        if (!error) {
            seen.checkpointsSaved += 1;
            writeStatus();
        }
    });
}

function checkpointConsumer() {
    return Streams.simpleCheckpointConsumer(AppState, (appState, error) => {
        if (!error && appState) {
            state = appState;
            seen.checkpointsLoaded += 1;
            writeStatus();
        }
    });
}

let config;

async function main() {
    await Ambrosia.initializeAsync();
    config = new Ambrosia.Configuration.AmbrosiaConfig(dispatcher, checkpointProducer, checkpointConsumer);
    state = IC.start(config, AppState);
    writeStatus();
}

main().catch((error) => {
    console.error(`app: ${error && error.stack ? error.stack : error}`);
    process.exit(2);
});
